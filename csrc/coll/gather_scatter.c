/* gather and scatter: direct.  The root posts all its receives (sends)
 * at once and the transport overlaps them; every other rank sends
 * (receives) one block. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"

static bool gather_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    if (op->bytes == 0) return true;
    r->phase = "direct";
    if (c->rank != op->root) return run_send(r, op->root, 0, op->src, op->bytes) >= 0;
    uint8_t *dst = op->dst;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && run_recv(r, q, 0, dst + (size_t)q * op->bytes, op->bytes) < 0) return false;
    uint8_t *mine = dst + (size_t)c->rank * op->bytes;
    if ((const uint8_t *)op->src != mine) memcpy(mine, op->src, op->bytes);
    return true; /* the worker waits for them */
}

static bool scatter_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    if (op->bytes == 0) return true;
    r->phase = "direct";
    if (c->rank != op->root) return run_recv(r, op->root, 0, op->dst, op->bytes) >= 0;
    const uint8_t *src = op->src;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && run_send(r, q, 0, src + (size_t)q * op->bytes, op->bytes) < 0) return false;
    const uint8_t *mine = src + (size_t)c->rank * op->bytes;
    if (mine != (const uint8_t *)op->dst) memcpy(op->dst, mine, op->bytes);
    return true;
}

static slime_status_t check(slime_comm_t *comm, const char *name, const void *src, size_t bytes, void *dst,
                            int root, slime_req_t **out, bool gather) {
    slime_status_t st = coll_check(comm, out, name, true, root);
    if (st != SLIME_OK) return st;
    if (bytes > SIZE_MAX / (size_t)comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "%s: %d x %zu bytes overflow", name, comm->size, bytes);
    if (!bytes) return SLIME_OK;
    bool root_here = comm->rank == root;
    /* gather: src everywhere, dst at the root; scatter the reverse */
    if (!src && (gather || root_here))
        return slime_errorf(SLIME_ERR_INVAL, "%s: NULL src buffer with %zu bytes", name, bytes);
    if (!dst && (!gather || root_here))
        return slime_errorf(SLIME_ERR_INVAL, "%s: NULL dst buffer with %zu bytes", name, bytes);
    return SLIME_OK;
}

slime_status_t slime_gather(slime_comm_t *comm, const void *src, size_t bytes, void *dst, int root,
                            slime_req_t **out) {
    slime_status_t st = check(comm, "gather", src, bytes, dst, root, out, true);
    if (st != SLIME_OK) return st;
    coll_op_t t = {.exec = gather_exec, .name = "gather", .src = src, .dst = dst, .bytes = bytes, .root = root};
    return coll_post(comm, &t, out);
}

slime_status_t slime_scatter(slime_comm_t *comm, const void *src, size_t bytes, void *dst, int root,
                             slime_req_t **out) {
    slime_status_t st = check(comm, "scatter", src, bytes, dst, root, out, false);
    if (st != SLIME_OK) return st;
    coll_op_t t = {.exec = scatter_exec, .name = "scatter", .src = src, .dst = dst, .bytes = bytes, .root = root};
    return coll_post(comm, &t, out);
}
