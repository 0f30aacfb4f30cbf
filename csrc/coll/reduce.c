/* reduce to a root, in place (other ranks' buffers are scratch).  Small
 * messages: a binomial tree toward the root.  Large ones: the ring's
 * reduce-scatter, after which each rank sends the block it finished to
 * the root, so every rank moves about one buffer in all instead of the
 * root receiving log2 n of them. */
#include <stdint.h>

#include "coll/coll.h"
#include "coll/reduce_kernels.h"

/* The block messages to the root come after every ring step. */
#define STEP_TO_ROOT (COLL_STEP_LIMIT - 1)

static bool binomial(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    const int vr = mod_rank(c->rank - op->root, n);
    const size_t bytes = op->count * slime_dtype_size(op->dtype);
    uint8_t *tmp = comm_scratch(c, bytes);
    if (!tmp) return run_fail(r, SLIME_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    r->phase = "binomial tree";
    uint32_t round = 0;
    for (int mask = 1; mask < n; mask <<= 1, round++) {
        if (vr & mask) {
            int h = run_send_bounded(r, mod_rank(vr - mask + op->root, n), round, op->buf, bytes);
            return h >= 0 && run_wait_one(r, h);
        }
        if (vr + mask < n) {
            int h = run_recv(r, mod_rank(vr + mask + op->root, n), round, tmp, bytes);
            if (h < 0 || !run_wait_one(r, h)) return false;
            red_accumulate(op->dtype, op->redop, op->buf, tmp, op->count);
        }
    }
    if (op->redop == SLIME_RED_AVG) red_divide(op->dtype, op->buf, op->count, n);
    return true;
}

static bool ring_then_gather(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    const size_t es = slime_dtype_size(op->dtype);
    ring_plan_t p = {
        .mode = RING_INPLACE,
        .buf = op->buf,
        .total = op->count,
        .esize = es,
        .dtype = op->dtype,
        .redop = op->redop,
        .shift = 0,
        .steps = n - 1,
        .reduce_steps = n - 1,
        .avg = op->redop == SLIME_RED_AVG,
    };
    r->phase = "ring reduce-scatter";
    if (!ring_run(r, &p)) return false;
    /* rank q now holds the result of block q + 1 */
    r->phase = "gather to root";
    uint8_t *buf = op->buf;
    size_t off, len;
    if (c->rank != op->root) {
        ring_block(&p, n, mod_rank(c->rank + 1, n), &off, &len);
        return run_send(r, op->root, STEP_TO_ROOT, buf + off * es, len * es) >= 0;
    }
    for (int q = 0; q < n; q++) {
        if (q == c->rank) continue;
        ring_block(&p, n, mod_rank(q + 1, n), &off, &len);
        if (run_recv(r, q, STEP_TO_ROOT, buf + off * es, len * es) < 0) return false;
    }
    return true; /* the worker waits for them */
}

static bool reduce_exec(coll_run_t *r, const coll_op_t *op) {
    const int n = r->comm->size;
    if (n == 1 || op->count == 0) return true;
    if (op->count * slime_dtype_size(op->dtype) <= coll_small_bytes() || op->count < (size_t)n)
        return binomial(r, op);
    return ring_then_gather(r, op);
}

slime_status_t slime_reduce(slime_comm_t *comm, void *buf, size_t count, slime_dtype_t dtype,
                            slime_redop_t op, int root, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "reduce", true, root);
    if (st == SLIME_OK) st = coll_check_reduce("reduce", dtype, op);
    if (st != SLIME_OK) return st;
    size_t es = slime_dtype_size(dtype);
    if (count > SIZE_MAX / es) return slime_errorf(SLIME_ERR_INVAL, "reduce: %zu elements overflow", count);
    if (!buf && count) return slime_errorf(SLIME_ERR_INVAL, "reduce: NULL buffer of %zu elements", count);
    coll_op_t t = {.exec = reduce_exec, .name = "reduce", .typed = true, .buf = buf, .count = count,
                   .dtype = dtype, .redop = op, .root = root};
    return coll_post(comm, &t, out);
}
