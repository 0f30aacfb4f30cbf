/* alltoallv: every receive posted first, then every send, then one wait:
 * the transports move all pairs at once.  Zero-length pairs still send
 * a (empty) message, so both sides never need to agree on skipping. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

static bool alltoallv_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size, me = c->rank;
    const size_t *sb = op->v, *so = op->v + n, *rb = op->v + 2 * n, *ro = op->v + 3 * n;
    const uint8_t *src = op->src;
    uint8_t *dst = op->dst;
    r->phase = "direct";
    /* start with the next rank so that no rank is everyone's first */
    for (int i = 1; i < n; i++) {
        int q = (me - i + n) % n;
        if (run_recv(r, q, 0, rb[q] ? dst + ro[q] : NULL, rb[q]) < 0) return false;
    }
    for (int i = 1; i < n; i++) {
        int q = (me + i) % n;
        if (run_send(r, q, 0, sb[q] ? src + so[q] : NULL, sb[q]) < 0) return false;
    }
    if (sb[me]) memmove(dst + ro[me], src + so[me], sb[me]);
    return true; /* the worker waits for them */
}

slime_status_t slime_alltoallv(slime_comm_t *comm, const void *src, const size_t *send_bytes,
                               const size_t *send_offs, void *dst, const size_t *recv_bytes,
                               const size_t *recv_offs, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "alltoallv", false, 0);
    if (st != SLIME_OK) return st;
    if (!send_bytes || !send_offs || !recv_bytes || !recv_offs)
        return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL size or offset array");
    const int n = comm->size;
    for (int q = 0; q < n; q++) {
        if (send_bytes[q] && !src)
            return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL src with %zu bytes for rank %d", send_bytes[q], q);
        if (recv_bytes[q] && !dst)
            return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL dst with %zu bytes from rank %d", recv_bytes[q], q);
        if (send_offs[q] > SIZE_MAX - send_bytes[q] || recv_offs[q] > SIZE_MAX - recv_bytes[q])
            return slime_errorf(SLIME_ERR_INVAL, "alltoallv: offset + bytes overflow for rank %d", q);
    }
    if (send_bytes[comm->rank] != recv_bytes[comm->rank])
        return slime_errorf(SLIME_ERR_INVAL, "alltoallv: this rank sends itself %zu bytes but receives %zu",
                            send_bytes[comm->rank], recv_bytes[comm->rank]);
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) return slime_errorf(SLIME_ERR_NOMEM, "alltoallv: out of memory");
    memcpy(v, send_bytes, (size_t)n * sizeof *v);
    memcpy(v + n, send_offs, (size_t)n * sizeof *v);
    memcpy(v + 2 * n, recv_bytes, (size_t)n * sizeof *v);
    memcpy(v + 3 * n, recv_offs, (size_t)n * sizeof *v);
    size_t total = 0;
    for (int q = 0; q < n; q++) total += send_bytes[q];
    coll_op_t t = {.exec = alltoallv_exec, .name = "alltoallv", .src = src, .dst = dst, .bytes = total, .v = v};
    return coll_post(comm, &t, out);
}
