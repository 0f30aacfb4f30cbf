/*
 * test_ep_release.c - endpoints given back (slime_ep_release) are freed
 * once their peer is gone, and nothing the application still holds
 * points at freed memory: a server released by each of many clients that
 * came and went, an endpoint released while still up and found again by
 * a receive, and a request that outlives its context.  Run under ASan,
 * a use after free or a double free fails it.
 *
 * DLSLIME_TEST_CLIENTS=N plays N clients instead, and logs the server's
 * resident set after a tenth of them and after the last (the figure of
 * issue 13 is N = 100000; tests/adversarial/test_endpoint_lifetime.py
 * asserts it flat through Python).
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLIENTS 100

static int clients(void)
{
    const char *env = getenv("DLSLIME_TEST_CLIENTS");
    return env && atoi(env) > 0 ? atoi(env) : CLIENTS;
}

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}
#define NOTICE_BOUND_MS 5000

static void ping_pong(slime_ep_t *ep, uint64_t seed, uint64_t peer_seed)
{
    uint8_t out[64], in[64];
    slime_req_t *s = NULL, *r = NULL;
    h_fill(out, sizeof out, seed, 0);
    H_CHECK_OK(slime_recv(ep, in, sizeof in, 1, &r));
    H_CHECK_OK(slime_send(ep, out, sizeof out, 1, &s));
    H_WAIT_FREE(s, SLIME_OK);
    H_WAIT_FREE(r, SLIME_OK);
    H_CHECK_PATTERN(in, sizeof in, peer_seed, 0);
}

static void wait_down(slime_ep_t *ep)
{
    const int64_t start = h_now_ms();
    while (slime_ep_status(ep) == SLIME_OK) {
        if (h_now_ms() - start > NOTICE_BOUND_MS)
            h_fail(__FILE__, __LINE__, "peer's leaving not noticed in %d ms", NOTICE_BOUND_MS);
        h_sleep_ms(2);
    }
}

/* Rank 1 plays CLIENTS clients, each a context of its own that connects,
 * calls once and leaves; rank 0 serves each and gives its endpoint back. */
static void case_clients_come_and_go(h_rank_t *r)
{
    uint8_t blob[SLIME_ADDRESS_MAX];
    const int n = clients();
    if (r->rank == 0) {
        slime_ctx_t *ctx = h_ctx_create(NULL);
        size_t len = h_ctx_address(ctx, blob);
        h_ctl_send(r, 1, blob, len);
        long warm = 0;
        for (int i = 0; i < n; i++) {
            slime_ep_t *ep = NULL;
            H_CHECK_OK(slime_ep_accept(ctx, H_WAIT_MS, &ep));
            ping_pong(ep, 1000 + (uint64_t)i, 2000 + (uint64_t)i);
            /* every other one is given back before its client leaves */
            if (i % 2) wait_down(ep);
            slime_ep_release(ep);
            if (i + 1 == n / 10) warm = rss_kib();
        }
        h_log("server RSS %ld KiB after %d clients, %ld KiB after %d", warm, n / 10, rss_kib(), n);
        h_barrier(r);
        slime_ctx_destroy(ctx);
        return;
    }
    size_t len = h_ctl_recv(r, 0, blob, sizeof blob);
    for (int i = 0; i < n; i++) {
        slime_ctx_t *ctx = h_ctx_create(NULL);
        slime_ep_t *ep = NULL;
        H_CHECK_OK(slime_ep_connect(ctx, blob, len, H_WAIT_MS, &ep));
        ping_pong(ep, 2000 + (uint64_t)i, 1000 + (uint64_t)i);
        slime_ctx_destroy(ctx);
    }
    h_barrier(r);
}

/* Rank 0 gives its endpoint back while it is up: a receive from any peer
 * still finds it, and a hold taken on the request's endpoint keeps it
 * past the peer's leaving. */
static void case_release_while_up(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    slime_ep_t *eps[H_MAX_RANKS];
    h_connect_all(r, ctx, eps);
    if (r->rank == 1) {
        uint8_t out[16];
        h_fill(out, sizeof out, 7, 0);
        h_barrier(r);
        slime_req_t *s = NULL;
        H_CHECK_OK(slime_send(eps[peer], out, sizeof out, 9, &s));
        H_WAIT_FREE(s, SLIME_OK);
        h_barrier(r);
        slime_ctx_destroy(ctx);
        return;
    }
    slime_ep_release(eps[peer]);
    h_barrier(r);
    uint8_t in[16];
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv_any(ctx, in, sizeof in, 9, &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_PATTERN(in, sizeof in, 7, 0);
    slime_ep_t *ep = slime_req_ep(req);
    H_CHECK(ep == eps[peer]);
    slime_ep_hold(ep);
    slime_req_free(req);
    h_barrier(r);
    wait_down(ep);
    h_sleep_ms(50); /* progress passes that must not free it */
    H_CHECK(slime_ep_status(ep) != SLIME_OK);
    H_CHECK(slime_ep_peer_id(ep) != 0);
    slime_ep_release(ep);
    slime_ctx_destroy(ctx);
}

/* A request on a released endpoint outlives the context: freeing it
 * afterwards frees the endpoint it names. */
static void case_request_outlives_context(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    slime_ep_t *eps[H_MAX_RANKS];
    h_connect_all(r, ctx, eps);
    uint8_t buf[16];
    slime_req_t *pending = NULL;
    H_CHECK_OK(slime_recv(eps[peer], buf, sizeof buf, 3, &pending));
    slime_ep_release(eps[peer]);
    h_barrier(r);
    slime_ctx_destroy(ctx);
    H_CHECK(slime_req_ep(pending) == eps[peer]);
    /* closed by our destroy, unless the peer's was noticed first */
    H_CHECK_ONE_OF(slime_req_test(pending), SLIME_ERR_CLOSED, SLIME_ERR_PEER_LOST);
    slime_req_free(pending);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"clients_come_and_go", case_clients_come_and_go, 2, true, 0},
        {"release_while_up", case_release_while_up, 2, true, 0},
        {"request_outlives_context", case_request_outlives_context, 2, true, 0},
    };
    return h_main("test_ep_release", cases, sizeof cases / sizeof cases[0], argc, argv);
}
