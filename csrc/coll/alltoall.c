/* alltoallv: every receive posted first, then every send, then one wait:
 * the transports move all pairs at once.  Zero-length pairs still send
 * a (empty) message, so both sides never need to agree on skipping.
 * Each peer's block has an address of its own, so that a list of
 * tensors needs no flat staging copy. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* op->v: per peer, the bytes to send, where they are, the bytes to
 * receive and where they go (4 * size entries, addresses as size_t). */
static bool alltoallv_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size, me = c->rank;
    const size_t *sb = op->v, *sp = op->v + n, *rb = op->v + 2 * n, *rp = op->v + 3 * n;
    r->phase = "direct";
    /* start with the next rank so that no rank is everyone's first */
    for (int i = 1; i < n; i++) {
        int q = (me - i + n) % n;
        if (run_recv(r, q, 0, (void *)rp[q], rb[q]) < 0) return false;
    }
    for (int i = 1; i < n; i++) {
        int q = (me + i) % n;
        if (run_send(r, q, 0, (const void *)sp[q], sb[q]) < 0) return false;
    }
    if (sb[me] && sp[me] != rp[me]) memmove((void *)rp[me], (const void *)sp[me], sb[me]);
    return true; /* the worker waits for them */
}

/* After coll_check: the rest of the checks, and the post.  Each entry
 * point runs coll_check once: a second one would drop the caller's
 * slime_comm_next_waited, and the post would wake the worker. */
static slime_status_t alltoallv_post(slime_comm_t *comm, const void *const *srcs, const size_t *send_bytes,
                                     void *const *dsts, const size_t *recv_bytes, slime_req_t **out) {
    if (!srcs || !send_bytes || !dsts || !recv_bytes)
        return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL buffer or size array");
    const int n = comm->size;
    for (int q = 0; q < n; q++) {
        if (send_bytes[q] && !srcs[q])
            return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL src with %zu bytes for rank %d", send_bytes[q], q);
        if (recv_bytes[q] && !dsts[q])
            return slime_errorf(SLIME_ERR_INVAL, "alltoallv: NULL dst with %zu bytes from rank %d", recv_bytes[q], q);
    }
    if (send_bytes[comm->rank] != recv_bytes[comm->rank])
        return slime_errorf(SLIME_ERR_INVAL, "alltoallv: this rank sends itself %zu bytes but receives %zu",
                            send_bytes[comm->rank], recv_bytes[comm->rank]);
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) return slime_errorf(SLIME_ERR_NOMEM, "alltoallv: out of memory");
    size_t total = 0;
    for (int q = 0; q < n; q++) {
        v[q] = send_bytes[q];
        v[n + q] = send_bytes[q] ? (size_t)(uintptr_t)srcs[q] : 0;
        v[2 * n + q] = recv_bytes[q];
        v[3 * n + q] = recv_bytes[q] ? (size_t)(uintptr_t)dsts[q] : 0;
        total += send_bytes[q];
    }
    coll_op_t t = {.exec = alltoallv_exec, .name = "alltoallv", .bytes = total, .v = v};
    return coll_post(comm, &t, out);
}

slime_status_t slime_alltoallv_ptrs(slime_comm_t *comm, const void *const *srcs, const size_t *send_bytes,
                                    void *const *dsts, const size_t *recv_bytes, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "alltoallv", false, 0);
    return st == SLIME_OK ? alltoallv_post(comm, srcs, send_bytes, dsts, recv_bytes, out) : st;
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
    /* the same collective with each peer's buffer spelled out */
    const void **srcs = malloc((size_t)n * sizeof *srcs);
    void **dsts = malloc((size_t)n * sizeof *dsts);
    if (!srcs || !dsts) {
        free(srcs);
        free(dsts);
        return slime_errorf(SLIME_ERR_NOMEM, "alltoallv: out of memory");
    }
    for (int q = 0; q < n; q++) {
        srcs[q] = send_bytes[q] ? (const uint8_t *)src + send_offs[q] : NULL;
        dsts[q] = recv_bytes[q] ? (uint8_t *)dst + recv_offs[q] : NULL;
    }
    st = alltoallv_post(comm, srcs, send_bytes, dsts, recv_bytes, out);
    free(srcs);
    free(dsts);
    return st;
}
