/* allreduce, in place.  Small messages: recursive doubling (log2 n
 * exchanges of the whole buffer), the ranks beyond the largest power of
 * two first folding their data into a neighbour and getting the result
 * back at the end.  Large ones: the pipelined ring, reduce-scatter then
 * allgather in one stream of chunks (each rank moves 2 (n-1)/n of the
 * buffer, whatever n is). */
#include <stdint.h>

#include "coll/coll.h"
#include "coll/reduce_kernels.h"

/* The exchanges, of count elements at buf, use steps from step0 on
 * (at most 34 of them). */
static bool recursive_doubling(coll_run_t *r, const coll_op_t *op, uint32_t step0) {
    slime_comm_t *c = r->comm;
    const int n = c->size, rank = c->rank;
    const size_t bytes = op->count * slime_dtype_size(op->dtype);
    uint8_t *buf = op->buf, *tmp = comm_scratch(c, bytes);
    if (!tmp) return run_fail(r, SLIME_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    int p2 = 1, rounds = 0;
    while (p2 * 2 <= n) {
        p2 *= 2;
        rounds++;
    }
    const int extra = n - p2;
    const uint32_t fold_out = step0 + (uint32_t)rounds + 1;
    int vr;
    r->phase = "fold";
    if (rank < 2 * extra) {
        if (rank % 2 == 0) { /* hand the data over, get the result back */
            int h = run_send(r, rank + 1, step0, buf, bytes);
            if (h < 0 || !run_wait_one(r, h)) return false;
            h = run_recv(r, rank + 1, fold_out, buf, bytes);
            return h >= 0 && run_wait_one(r, h);
        }
        int h = run_recv(r, rank - 1, step0, tmp, bytes);
        if (h < 0 || !run_wait_one(r, h)) return false;
        red_accumulate(op->dtype, op->redop, buf, tmp, op->count);
        vr = rank / 2;
    } else {
        vr = rank - extra;
    }
    r->phase = "recursive doubling";
    for (int mask = 1, round = 1; mask < p2; mask <<= 1, round++) {
        int pv = vr ^ mask;
        int partner = pv < extra ? 2 * pv + 1 : pv + extra;
        if (!run_exchange(r, partner, buf, bytes, partner, tmp, bytes, step0 + (uint32_t)round)) return false;
        /* both partners combine in the same order (lower rank's data
         * first), so every rank ends with the very same bits */
        if (partner < rank) red_accumulate_swapped(op->dtype, op->redop, buf, tmp, op->count);
        else red_accumulate(op->dtype, op->redop, buf, tmp, op->count);
    }
    if (op->redop == SLIME_RED_AVG) red_divide(op->dtype, buf, op->count, n);
    if (rank < 2 * extra) {
        r->phase = "fold";
        int h = run_send(r, rank - 1, fold_out, buf, bytes);
        return h >= 0 && run_wait_one(r, h);
    }
    return true;
}

static bool allreduce_exec(coll_run_t *r, const coll_op_t *op) {
    const int n = r->comm->size;
    const size_t es = slime_dtype_size(op->dtype);
    if (n == 1 || op->count == 0) return true;
    if (pairbox_usable(r, op->count * es)) return pairbox_allreduce(r, op);
    if (!run_ok(r)) return false;
    /* both ends of a connection see the same transport: the ranks agree */
    bool shm_pair = n == 2 && p2p_ep_can(r->comm->peers[1 - r->comm->rank], P2P_CAP_CPU_RMA);
    size_t small = shm_pair ? coll_pair_small_bytes() : coll_small_bytes();
    if (op->count * es <= small || op->count < (size_t)n) return recursive_doubling(r, op, 0);
    ring_plan_t p = {
        .mode = RING_INPLACE,
        .buf = op->buf,
        .total = op->count,
        .esize = es,
        .dtype = op->dtype,
        .redop = op->redop,
        .shift = 0,
        .steps = 2 * (n - 1),
        .reduce_steps = n - 1,
        .avg = op->redop == SLIME_RED_AVG,
    };
    r->phase = "ring";
    return ring_run(r, &p);
}

/* Steps of run_agree_all's exchanges: below the rings' set-up steps
 * (ring.c), far above those of a ring's first chunks.  Where a large
 * ring's steps wrap round into them, messages of one tag between two
 * ranks still match in order, and these go first. */
#define AGREE_ALL_STEP0 (COLL_STEP_LIMIT - 64)

bool run_agree_all(coll_run_t *r, bool mine, bool *all) {
    uint8_t flag = mine;
    coll_op_t op = {.buf = &flag, .count = 1, .dtype = SLIME_DT_UINT8, .redop = SLIME_RED_MIN};
    const char *phase = r->phase;
    bool ok = r->comm->size == 1 || recursive_doubling(r, &op, AGREE_ALL_STEP0);
    r->phase = phase;
    *all = flag != 0;
    return ok;
}

slime_status_t slime_allreduce(slime_comm_t *comm, void *buf, size_t count, slime_dtype_t dtype,
                               slime_redop_t op, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "allreduce", false, 0);
    if (st == SLIME_OK) st = coll_check_reduce("allreduce", dtype, op);
    if (st != SLIME_OK) return st;
    size_t es = slime_dtype_size(dtype);
    if (count > SIZE_MAX / es) return slime_errorf(SLIME_ERR_INVAL, "allreduce: %zu elements overflow", count);
    if (!buf && count) return slime_errorf(SLIME_ERR_INVAL, "allreduce: NULL buffer of %zu elements", count);
    coll_op_t t = {.exec = allreduce_exec, .name = "allreduce", .typed = true, .buf = buf, .count = count,
                   .dtype = dtype, .redop = op};
    return coll_post(comm, &t, out);
}
