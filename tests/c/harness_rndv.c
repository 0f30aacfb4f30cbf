/*
 * harness_rndv.c - rendezvous moved both ways between two ranks, with
 * the receive posted before the announcement and after it, every byte
 * checked, on a context made for the purpose: what the tests of fetched
 * rendezvous (tcp_cma, shm_fetch) share.
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

slime_ctx_t *h_pair_ctx(h_rank_t *r, const char *transport, const char *env, const char *mode, slime_ep_t **ep) {
    if (mode) H_CHECK(setenv(env, mode, 1) == 0);
    else H_CHECK(unsetenv(env) == 0);
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    opts.transport = transport;
    slime_ctx_t *ctx = h_ctx_create(&opts);
    slime_ep_t *eps[H_MAX_RANKS] = {NULL};
    h_connect_all(r, ctx, eps);
    *ep = eps[h_peer(r)];
    H_CHECK(strcmp(slime_ep_transport(*ep), transport) == 0);
    return ctx;
}

uint64_t h_rendezvous_counted(h_rank_t *r, const char *transport, const char *env, const char *mode,
                              const size_t *sizes, size_t n, uint64_t tag, slime_counter_t which) {
    slime_ep_t *ep = NULL;
    slime_ctx_t *ctx = h_pair_ctx(r, transport, env, mode, &ep);
    h_rendezvous_both_ways(r, ep, sizes, n, tag);
    uint64_t count = slime_ctx_counter(ctx, which);
    slime_ctx_destroy(ctx);
    return count;
}
