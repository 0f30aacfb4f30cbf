/*
 * test_close.c - orderly endings: closing an endpoint fails what is pending
 * on it and tells the peer, a later connect dials anew, and destroying a
 * context with requests and MRs still held leaves them safe to free.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define NOTICE_BOUND_MS 5000

static void wait_not_ok(slime_ep_t *ep)
{
    const int64_t start = h_now_ms();
    while (slime_ep_status(ep) == SLIME_OK) {
        if (h_now_ms() - start > NOTICE_BOUND_MS)
            h_fail(__FILE__, __LINE__, "peer's close not noticed in %d ms",
                   NOTICE_BOUND_MS);
        h_sleep_ms(5);
    }
}

static void ping_pong(slime_ep_t *ep, int me, int peer)
{
    uint8_t out[300], in[300];
    slime_req_t *s = NULL, *r = NULL;
    h_fill(out, sizeof out, 80 + (uint64_t)me, 0);
    H_CHECK_OK(slime_recv(ep, in, sizeof in, 1, &r));
    H_CHECK_OK(slime_send(ep, out, sizeof out, 1, &s));
    H_WAIT_FREE(s, SLIME_OK);
    H_WAIT(r, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(r), sizeof in);
    slime_req_free(r);
    H_CHECK_PATTERN(in, sizeof in, 80 + (uint64_t)peer, 0);
}

/* Rank 0 closes its endpoint with a receive pending on each side. */
static void case_close_endpoint(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, r->ctx, blobs, lens);
    uint8_t buf[64];
    slime_req_t *pending = NULL, *req = NULL;
    H_CHECK_OK(slime_recv(ep, buf, sizeof buf, 5, &pending));
    h_barrier(r);

    if (r->rank == 0) {
        slime_ep_close(ep);
        H_WAIT_FREE(pending, SLIME_ERR_CLOSED);
        H_CHECK_EQ(slime_ep_status(ep), SLIME_ERR_CLOSED);
        slime_status_t s = H_OUTCOME(req, slime_send(ep, buf, 8, 5, &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_CLOSED);
        s = H_OUTCOME(req, slime_recv(ep, buf, 8, 5, &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_CLOSED);
        /* Closing twice is harmless. */
        slime_ep_close(ep);
    } else {
        slime_status_t s = slime_req_wait(pending, NOTICE_BOUND_MS);
        H_CHECK(s == SLIME_ERR_PEER_LOST || s == SLIME_ERR_CLOSED);
        slime_req_free(pending);
        wait_not_ok(ep);
    }
    h_barrier(r);

    /* Both dial again: a fresh endpoint that works. */
    slime_ep_t *fresh = NULL;
    H_CHECK_OK(slime_ep_connect(r->ctx, blobs[peer], lens[peer], H_WAIT_MS,
                                &fresh));
    H_CHECK(fresh != ep);
    H_CHECK_EQ(slime_ep_status(fresh), SLIME_OK);
    ping_pong(fresh, r->rank, peer);
}

/* Rank 0 destroys its context while it still has a receive, a large send
 * and an MR outstanding: rank 1 sees the peer go, and rank 0 can still
 * free the requests and deregister the MR afterwards. */
static void case_destroy_with_pending(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    slime_ep_t *eps[H_MAX_RANKS];
    h_connect_all(r, ctx, eps);
    slime_ep_t *ep = eps[peer];
    const size_t big = 8u << 20;
    uint8_t *buf = h_alloc(big);
    slime_mr_t *mr = h_mr_reg(ctx, buf, big, SLIME_ACCESS_ALL);
    slime_req_t *recv = NULL, *send = NULL;
    H_CHECK_OK(slime_recv(ep, buf, 64, 1, &recv));

    if (r->rank == 0) {
        H_CHECK_OK(slime_send(ep, buf, big, 2, &send));
        h_barrier(r);
        slime_ctx_destroy(ctx);
        slime_req_free(recv);
        slime_req_free(send);
        H_CHECK_OK(slime_mr_dereg(mr));
        free(buf);
        h_barrier(r);
        return;
    }
    h_barrier(r);
    slime_status_t s = slime_req_wait(recv, NOTICE_BOUND_MS);
    H_CHECK(s == SLIME_ERR_PEER_LOST || s == SLIME_ERR_CLOSED);
    slime_req_free(recv);
    wait_not_ok(ep);
    h_barrier(r);
    H_CHECK_OK(slime_mr_dereg(mr));
    slime_ctx_destroy(ctx);
    free(buf);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"close_endpoint", case_close_endpoint, 2, false, 0},
        {"destroy_with_pending", case_destroy_with_pending, 2, true, 0},
    };
    return h_main("test_close", cases, sizeof cases / sizeof cases[0], argc,
                  argv);
}
