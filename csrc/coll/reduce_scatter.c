/* reduce_scatter: the ring's reduce-scatter, reading the caller's src
 * blocks (which stay untouched) and leaving the result in dst.  Partial
 * sums travel in scratch slots; each rank moves (n - 1)/n of src.  Each
 * src block has an address of its own, so that a list of tensors needs
 * no flat staging copy; the flat form names the blocks of one buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* op->ptrs: the size src block addresses */
static bool reduce_scatter_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    const size_t es = slime_dtype_size(op->dtype);
    if (op->count == 0) return true;
    const uint8_t *const *src_blocks = (const uint8_t *const *)op->ptrs;
    if (n == 1) {
        if (op->dst != src_blocks[0]) memmove(op->dst, src_blocks[0], op->count * es);
        return true; /* AVG over one rank divides by one */
    }
    if (pairbox_usable(r, op->count * es)) return pairbox_reduce_scatter(r, op);
    if (!run_ok(r)) return false;
    ring_plan_t p = {
        .mode = RING_FROM_SRC,
        .src_blocks = src_blocks,
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

/* The checks both entry points share: the communicator, the output
 * request, dtype x op, and n x count elements fitting in memory. */
static slime_status_t reduce_scatter_check(slime_comm_t *comm, slime_req_t **out, size_t count,
                                           slime_dtype_t dtype, slime_redop_t op) {
    slime_status_t st = coll_check(comm, out, "reduce_scatter", false, 0);
    if (st == SLIME_OK) st = coll_check_reduce("reduce_scatter", dtype, op);
    if (st != SLIME_OK) return st;
    if (count > SIZE_MAX / slime_dtype_size(dtype) / (size_t)comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "reduce_scatter: %d x %zu elements overflow", comm->size, count);
    return SLIME_OK;
}

/* The rest of the checks, and the post.  Each entry point runs
 * reduce_scatter_check once: a second coll_check would drop the caller's
 * slime_comm_next_waited, and the post would wake the worker. */
static slime_status_t reduce_scatter_post(slime_comm_t *comm, const void *const *src_blocks, void *dst,
                                          size_t count, slime_dtype_t dtype, slime_redop_t op, slime_req_t **out) {
    if (count && !dst) return slime_errorf(SLIME_ERR_INVAL, "reduce_scatter: NULL dst buffer with %zu elements", count);
    coll_op_t t = {.exec = reduce_scatter_exec, .name = "reduce_scatter", .typed = true, .dst = dst,
                   .count = count, .dtype = dtype, .redop = op};
    slime_status_t st = coll_copy_blocks("reduce_scatter", "src block", src_blocks, comm->size, count, "elements",
                                         t.ptrs_small, &t.ptrs);
    if (st != SLIME_OK) return st;
    return coll_post(comm, &t, out);
}

slime_status_t slime_reduce_scatter_ptrs(slime_comm_t *comm, const void *const *src_blocks, void *dst,
                                         size_t count, slime_dtype_t dtype, slime_redop_t op, slime_req_t **out) {
    slime_status_t st = reduce_scatter_check(comm, out, count, dtype, op);
    return st == SLIME_OK ? reduce_scatter_post(comm, src_blocks, dst, count, dtype, op, out) : st;
}

slime_status_t slime_reduce_scatter(slime_comm_t *comm, const void *src, void *dst, size_t count,
                                    slime_dtype_t dtype, slime_redop_t op, slime_req_t **out) {
    slime_status_t st = reduce_scatter_check(comm, out, count, dtype, op);
    if (st != SLIME_OK) return st;
    size_t es = slime_dtype_size(dtype);
    if (count && !src) return slime_errorf(SLIME_ERR_INVAL, "reduce_scatter: NULL src buffer with %zu elements", count);
    /* the same collective with each block's address spelled out */
    const void *small[COLL_BLOCKS_SMALL];
    const void **blocks = coll_flat_blocks(src, comm->size, count * es, small);
    if (!blocks) return SLIME_ERR_NOMEM;
    st = reduce_scatter_post(comm, blocks, dst, count, dtype, op, out);
    coll_blocks_free(blocks, small);
    return st;
}
