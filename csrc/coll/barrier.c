/* barrier: dissemination.  In round k every rank signals rank + 2^k and
 * waits for rank - 2^k with an empty message; after ceil(log2 n) rounds
 * each rank has heard, directly or not, from all the others. */
#include "coll/coll.h"

static bool barrier_exec(coll_run_t *r, const coll_op_t *op) {
    (void)op;
    slime_comm_t *c = r->comm;
    const int n = c->size;
    if (pairbox_usable(r, 0)) return pairbox_barrier(r);
    if (!run_ok(r)) return false;
    r->phase = "dissemination";
    uint32_t round = 0;
    for (int k = 1; k < n; k <<= 1, round++)
        if (!run_exchange(r, mod_rank(c->rank + k, n), NULL, 0, mod_rank(c->rank - k, n), NULL, 0, round))
            return false;
    return true;
}

slime_status_t slime_barrier(slime_comm_t *comm, slime_req_t **out) {
    slime_status_t st = coll_check(comm, out, "barrier", false, 0);
    if (st != SLIME_OK) return st;
    coll_op_t t = {.exec = barrier_exec, .name = "barrier"};
    return coll_post(comm, &t, out);
}
