/*
 * test_connect.c - endpoint setup: two contexts dialing each other at once
 * share one connection; connect is idempotent; accept hands out what a peer
 * dialed, once; an acceptor's first send is not lost; a full mesh of four
 * processes.
 */
#include "harness.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ping_pong(slime_ep_t *ep, int me, int peer)
{
    uint8_t out[300], in[300];
    slime_req_t *s = NULL, *r = NULL;
    h_fill(out, sizeof out, 50 + (uint64_t)me, 0);
    H_CHECK_OK(slime_recv(ep, in, sizeof in, 1, &r));
    H_CHECK_OK(slime_send(ep, out, sizeof out, 1, &s));
    H_WAIT_FREE(s, SLIME_OK);
    H_WAIT(r, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(r), sizeof in);
    H_CHECK(slime_req_ep(r) == ep);
    slime_req_free(r);
    H_CHECK_PATTERN(in, sizeof in, 50 + (uint64_t)peer, 0);
}

/* Both dial at once and both get the same single connection. */
static void case_symmetric(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, ctx, blobs, lens);

    /* The blob is stable, and ids differ between contexts. */
    uint8_t again[SLIME_ADDRESS_MAX];
    H_CHECK_EQ(h_ctx_address(ctx, again), lens[r->rank]);
    H_CHECK(memcmp(again, blobs[r->rank], lens[r->rank]) == 0);
    h_ctl_send_u64(r, peer, slime_ctx_id(ctx));
    uint64_t peer_id = h_ctl_recv_u64(r, peer);
    H_CHECK(peer_id != slime_ctx_id(ctx));

    h_barrier(r);
    slime_ep_t *ep = NULL, *same = NULL, *accepted = NULL;
    H_CHECK_OK(slime_ep_connect(ctx, blobs[peer], lens[peer], H_WAIT_MS, &ep));
    H_CHECK_EQ(slime_ep_peer_id(ep), peer_id);
    H_CHECK_OK(slime_ep_connect(ctx, blobs[peer], lens[peer], H_WAIT_MS,
                                &same));
    H_CHECK(same == ep);
    ping_pong(ep, r->rank, peer);

    /* Whichever side was dialed may accept the endpoint, but it is the
     * one connect returned, and it comes only once. */
    h_barrier(r);
    slime_status_t s = slime_ep_accept(ctx, 200, &accepted);
    H_CHECK(s == SLIME_OK || s == SLIME_ERR_TIMEOUT);
    if (s == SLIME_OK) {
        H_CHECK(accepted == ep);
        accepted = NULL;
        H_CHECK_STATUS(slime_ep_accept(ctx, 100, &accepted),
                       SLIME_ERR_TIMEOUT);
    }
    H_CHECK(accepted == NULL);

    /* recv_any names that same endpoint. */
    uint8_t msg[16], got[16];
    slime_req_t *sreq = NULL, *rreq = NULL;
    h_fill(msg, sizeof msg, 9, 0);
    H_CHECK_OK(slime_recv_any(ctx, got, sizeof got, 2, &rreq));
    H_CHECK_OK(slime_send(ep, msg, sizeof msg, 2, &sreq));
    H_WAIT_FREE(sreq, SLIME_OK);
    H_WAIT(rreq, SLIME_OK);
    H_CHECK(slime_req_ep(rreq) == ep);
    slime_req_free(rreq);
    H_CHECK(memcmp(got, msg, sizeof msg) == 0);
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* Only rank 1 dials: rank 0 accepts it, and a later connect by rank 0
 * returns the accepted endpoint instead of dialing a second one. */
static void case_accept(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, ctx, blobs, lens);
    h_ctl_send_u64(r, peer, slime_ctx_id(ctx));
    uint64_t peer_id = h_ctl_recv_u64(r, peer);
    slime_ep_t *ep = NULL, *other = NULL;

    if (r->rank == 0) {
        /* Nobody has dialed yet. */
        H_CHECK_STATUS(slime_ep_accept(ctx, 100, &ep), SLIME_ERR_TIMEOUT);
        h_ctl_send_u64(r, peer, 1);
        H_CHECK_OK(slime_ep_accept(ctx, H_WAIT_MS, &ep));
        H_CHECK_EQ(slime_ep_peer_id(ep), peer_id);
        H_CHECK_OK(slime_ep_connect(ctx, blobs[peer], lens[peer], H_WAIT_MS,
                                    &other));
        H_CHECK(other == ep);
    } else {
        (void)h_ctl_recv_u64(r, peer);
        H_CHECK_OK(slime_ep_connect(ctx, blobs[peer], lens[peer], H_WAIT_MS,
                                    &ep));
        H_CHECK_EQ(slime_ep_peer_id(ep), peer_id);
    }
    ping_pong(ep, r->rank, peer);
    /* The dialer has nothing to accept; the acceptor nothing more. */
    H_CHECK_STATUS(slime_ep_accept(ctx, 100, &other), SLIME_ERR_TIMEOUT);
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* The sum of soft-RoCE's retransmission counters over every device, -1
 * where there are none (not rxe, or not verbs). */
static long long rdma_retries(void)
{
    glob_t g;
    long long sum = -1;
    if (glob("/sys/class/infiniband/*/ports/*/hw_counters/completer_retry_err", 0, NULL, &g) != 0)
        return -1;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "r");
        long long v = 0;
        if (f && fscanf(f, "%lld", &v) == 1)
            sum = (sum < 0 ? 0 : sum) + v;
        if (f)
            fclose(f);
    }
    globfree(&g);
    return sum;
}

/* The acceptor sends the moment accept returns, before the dialer may
 * have brought its side up: nothing it sent may be lost and resent on a
 * timer (on verbs, a packet to a queue pair not yet ready to receive is
 * dropped, and the retransmission comes seconds later). */
static void case_acceptor_first(h_rank_t *r)
{
    enum { ROUNDS = 8 };
    uint8_t blob[SLIME_ADDRESS_MAX];
    const long long retries_before = rdma_retries();
    if (r->rank == 0) {
        slime_ctx_t *ctx = h_ctx_create(NULL);
        h_ctl_send(r, 1, blob, h_ctx_address(ctx, blob));
        for (int i = 0; i < ROUNDS; i++) {
            slime_ep_t *ep = NULL;
            slime_req_t *s = NULL;
            uint8_t out[64];
            h_fill(out, sizeof out, 90 + (uint64_t)i, 0);
            H_CHECK_OK(slime_ep_accept(ctx, H_WAIT_MS, &ep));
            H_CHECK_OK(slime_send(ep, out, sizeof out, 3, &s));
            H_WAIT_FREE(s, SLIME_OK);
            (void)h_ctl_recv_u64(r, 1);
        }
        slime_ctx_destroy(ctx);
    } else {
        size_t len = h_ctl_recv(r, 0, blob, sizeof blob);
        for (int i = 0; i < ROUNDS; i++) {
            slime_ctx_t *ctx = h_ctx_create(NULL);
            slime_ep_t *ep = NULL;
            slime_req_t *q = NULL;
            uint8_t in[64];
            H_CHECK_OK(slime_ep_connect(ctx, blob, len, H_WAIT_MS, &ep));
            H_CHECK_OK(slime_recv(ep, in, sizeof in, 3, &q));
            H_WAIT_FREE(q, SLIME_OK);
            H_CHECK_PATTERN(in, sizeof in, 90 + (uint64_t)i, 0);
            h_ctl_send_u64(r, 0, 1);
            slime_ctx_destroy(ctx);
        }
    }
    h_barrier(r);
    if (retries_before < 0) {
        h_log("no soft-RoCE retransmission counters here: only the bytes were checked");
        return;
    }
    H_CHECK_EQ(rdma_retries(), retries_before);
}

/* Four processes, each connected to all others (by the harness): every
 * rank sends to every other and collects the three with recv_any. */
static void case_mesh(h_rank_t *r)
{
    enum { TAG = 11, LEN = 5000 };
    uint8_t out[LEN], in[H_MAX_RANKS][LEN];
    slime_req_t *sends[H_MAX_RANKS], *recvs[H_MAX_RANKS];
    int n = 0;
    for (int k = 0; k < r->nranks; k++) {
        if (k == r->rank)
            continue;
        H_CHECK_EQ(slime_ep_status(r->ep[k]), SLIME_OK);
        H_CHECK_OK(slime_recv_any(r->ctx, in[n], LEN, TAG, &recvs[n]));
        n++;
    }
    h_fill(out, LEN, 700 + (uint64_t)r->rank, 0);
    n = 0;
    for (int k = 0; k < r->nranks; k++)
        if (k != r->rank)
            H_CHECK_OK(slime_send(r->ep[k], out, LEN, TAG, &sends[n++]));
    H_CHECK_OK(slime_req_wait_all(sends, (size_t)n, H_WAIT_MS));
    H_CHECK_OK(slime_req_wait_all(recvs, (size_t)n, H_WAIT_MS));
    bool seen[H_MAX_RANKS] = {false};
    for (int i = 0; i < n; i++) {
        int from = -1;
        for (int k = 0; k < r->nranks; k++)
            if (k != r->rank && slime_req_ep(recvs[i]) == r->ep[k])
                from = k;
        H_CHECK(from >= 0 && !seen[from]);
        seen[from] = true;
        H_CHECK_EQ(slime_req_bytes(recvs[i]), LEN);
        H_CHECK_PATTERN(in[i], LEN, 700 + (uint64_t)from, 0);
        slime_req_free(recvs[i]);
        slime_req_free(sends[i]);
    }
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"symmetric", case_symmetric, 2, true, 0},
        {"accept", case_accept, 2, true, 0},
        {"acceptor_first", case_acceptor_first, 2, true, 0},
        {"mesh", case_mesh, 4, false, 0},
    };
    return h_main("test_connect", cases, sizeof cases / sizeof cases[0], argc,
                  argv);
}
