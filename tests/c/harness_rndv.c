/*
 * harness_rndv.c - rendezvous moved both ways between two ranks, with
 * the receive posted before the announcement and after it, every byte
 * checked: what the tests of fetched rendezvous (tcp_cma, shm_fetch)
 * share.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

/* Rank `from` sends every size; rank 1 - from receives, its receive
 * posted first for even sizes and after the announcement for odd ones. */
static void one_way(h_rank_t *r, slime_ep_t *ep, int from, uint8_t *buf, const size_t *sizes, size_t n,
                    uint64_t tag) {
    const int peer = h_peer(r);
    for (size_t i = 0; i < n; i++) {
        uint64_t seed = 100 + i + 10 * (uint64_t)from;
        slime_req_t *req = NULL;
        if (r->rank == from) {
            h_fill(buf, sizes[i], seed, 0);
            if (i % 2) (void)h_ctl_recv_u64(r, peer); /* its receive is posted */
            H_CHECK_OK(slime_send(ep, buf, sizes[i], tag + i, &req));
            if (!(i % 2)) h_ctl_send_u64(r, peer, 1); /* announced: receive now */
            H_WAIT_FREE(req, SLIME_OK);
        } else {
            memset(buf, 0, sizes[i]);
            if (!(i % 2)) (void)h_ctl_recv_u64(r, peer);
            H_CHECK_OK(slime_recv(ep, buf, sizes[i], tag + i, &req));
            if (i % 2) h_ctl_send_u64(r, peer, 1);
            H_WAIT(req, SLIME_OK);
            H_CHECK_EQ(slime_req_bytes(req), sizes[i]);
            H_CHECK_PATTERN(buf, sizes[i], seed, 0);
            slime_req_free(req);
        }
    }
}

void h_rendezvous_both_ways(h_rank_t *r, slime_ep_t *ep, const size_t *sizes, size_t n, uint64_t tag) {
    size_t most = 0;
    for (size_t i = 0; i < n; i++) most = sizes[i] > most ? sizes[i] : most;
    uint8_t *buf = h_alloc(most);
    one_way(r, ep, 0, buf, sizes, n, tag);
    one_way(r, ep, 1, buf, sizes, n, tag);
    h_barrier(r);
    free(buf);
}
