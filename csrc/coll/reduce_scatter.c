/* reduce_scatter: the ring's reduce-scatter, reading the caller's src
 * (which stays untouched) and leaving the result in dst.  Partial sums
 * travel in scratch slots; each rank moves (n - 1)/n of src. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"

static bool reduce_scatter_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    const size_t es = slime_dtype_size(op->dtype);
    if (op->count == 0) return true;
    if (n == 1) {
        if (op->dst != op->src) memcpy(op->dst, op->src, op->count * es);
        return true; /* AVG over one rank divides by one */
    }
    ring_plan_t p = {
        .mode = RING_FROM_SRC,
        .src = op->src,
        .dst = op->dst,
        .total = (size_t)n * op->count,
        .esize = es,
        .dtype = op->dtype,
        .redop = op->redop,
        .shift = -1, /* so that rank r finishes block r */
        .steps = n - 1,
        .reduce_steps = n - 1,
        .avg = op->redop == SLIME_RED_AVG,
    };
    r->phase = "ring";
    return ring_run(r, &p);
}

slime_status_t slime_reduce_scatter(slime_comm_t *comm, const void *src, void *dst, size_t count,
                                    slime_dtype_t dtype, slime_redop_t op, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "reduce_scatter", false, 0);
    if (st == SLIME_OK) st = coll_check_reduce("reduce_scatter", dtype, op);
    if (st != SLIME_OK) return st;
    size_t es = slime_dtype_size(dtype);
    if (count > SIZE_MAX / es / (size_t)comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "reduce_scatter: %d x %zu elements overflow", comm->size, count);
    if (count && (!src || !dst))
        return slime_errorf(SLIME_ERR_INVAL, "reduce_scatter: NULL %s buffer with %zu elements",
                            src ? "dst" : "src", count);
    coll_op_t t = {.exec = reduce_scatter_exec, .name = "reduce_scatter", .typed = true, .src = src, .dst = dst,
                   .count = count, .dtype = dtype, .redop = op};
    return coll_post(comm, &t, out);
}
