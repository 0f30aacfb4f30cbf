/* allgather: the ring, copying.  Rank r's block starts in dst at r *
 * bytes; at step s each rank passes on the block it got at step s - 1,
 * in chunks, so n - 1 steps move every block to every rank. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"

static bool allgather_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    uint8_t *dst = op->dst;
    if (op->bytes == 0) return true;
    uint8_t *mine = dst + (size_t)c->rank * op->bytes;
    if ((const uint8_t *)op->src != mine) memcpy(mine, op->src, op->bytes);
    ring_plan_t p = {
        .mode = RING_INPLACE,
        .buf = dst,
        .total = (size_t)n * op->bytes,
        .esize = 1,
        .shift = 0,
        .steps = n - 1,
        .reduce_steps = 0,
    };
    r->phase = "ring";
    return ring_run(r, &p);
}

slime_status_t slime_allgather(slime_comm_t *comm, const void *src, size_t bytes, void *dst,
                               slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "allgather", false, 0);
    if (st != SLIME_OK) return st;
    if (bytes > SIZE_MAX / (size_t)comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "allgather: %d x %zu bytes overflow", comm->size, bytes);
    if (bytes && (!src || !dst))
        return slime_errorf(SLIME_ERR_INVAL, "allgather: NULL %s buffer with %zu bytes", src ? "dst" : "src", bytes);
    coll_op_t t = {.exec = allgather_exec, .name = "allgather", .src = src, .dst = dst, .bytes = bytes};
    return coll_post(comm, &t, out);
}
