/*
 * test_unexpected.c - eager messages that arrive before their receive.
 *
 * Over shm such a message waits where it is, in the ring (parked), while
 * nothing arrives behind it, and is copied once when its receive comes;
 * elsewhere, and once something arrives behind it, it is copied into a
 * buffer of the context's first.  SLIME_COUNTER_UNEXPECTED_COPIES tells
 * the two apart, so each case checks which path ran as well as the bytes.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define LEN (64 * H_KIB) /* eager on every transport, above the park floor */

static bool parks(void)
{
    return strcmp(h_transport(), "shm") == 0;
}

static uint64_t copies(slime_ctx_t *ctx)
{
    return slime_ctx_counter(ctx, SLIME_COUNTER_UNEXPECTED_COPIES);
}

static void send_one(slime_ep_t *ep, uint64_t tag)
{
    uint8_t *buf = h_alloc(LEN);
    h_fill(buf, LEN, tag, 0);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_send(ep, buf, LEN, tag, &req));
    H_WAIT_FREE(req, SLIME_OK);
    free(buf);
}

/* Receives tag from ep (any peer when ep is NULL) and checks its bytes. */
static void recv_one(slime_ctx_t *ctx, slime_ep_t *ep, uint64_t tag)
{
    uint8_t *buf = h_alloc(LEN);
    slime_req_t *req = NULL;
    if (ep)
        H_CHECK_OK(slime_recv(ep, buf, LEN, tag, &req));
    else
        H_CHECK_OK(slime_recv_any(ctx, buf, LEN, tag, &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), (size_t)LEN);
    slime_req_free(req);
    H_CHECK_PATTERN(buf, LEN, tag, 0);
    free(buf);
}

/* Rank 0's messages are all out before rank 1 posts; rank 1 gets its
 * count of copies from before they came.  Over shm a completed eager
 * send is in the ring already; elsewhere rank 1 waits for each to come
 * in, as its copy (in the soft-RoCE VM that takes a while). */
static uint64_t sent_before(h_rank_t *r, const uint64_t *tags, int n)
{
    const int peer = h_peer(r);
    if (r->rank == 0) {
        (void)h_ctl_recv_u64(r, peer);
        for (int i = 0; i < n; i++)
            send_one(r->ep[peer], tags[i]);
        h_ctl_send_u64(r, peer, 1);
        return 0;
    }
    uint64_t before = copies(r->ctx);
    h_ctl_send_u64(r, peer, 1);
    (void)h_ctl_recv_u64(r, peer);
    const int64_t start = h_now_ms();
    while (!parks() && copies(r->ctx) - before < (uint64_t)n) {
        if (h_now_ms() - start > H_WAIT_MS)
            h_fail(__FILE__, __LINE__, "%d eager messages not in after %d ms", n, H_WAIT_MS);
        h_sleep_ms(1);
    }
    return before;
}

static void case_received_late(h_rank_t *r)
{
    const uint64_t tag = 11;
    uint64_t before = sent_before(r, &tag, 1);
    if (r->rank == 1) {
        recv_one(r->ctx, r->ep[h_peer(r)], tag);
        H_CHECK_EQ(copies(r->ctx) - before, (uint64_t)(parks() ? 0 : 1));
    }
    h_barrier(r);
}

/* A receive from any peer finds a parked message too. */
static void case_received_late_from_any(h_rank_t *r)
{
    const uint64_t tag = 12;
    uint64_t before = sent_before(r, &tag, 1);
    if (r->rank == 1) {
        /* the posting thread's part starts once the payload is parked */
        const int64_t start = h_now_ms();
        while (parks() && slime_ctx_counter(r->ctx, SLIME_COUNTER_PARKED) == 0) {
            if (h_now_ms() - start > H_WAIT_MS)
                h_fail(__FILE__, __LINE__, "the payload was not parked in %d ms", H_WAIT_MS);
            h_sleep_ms(1);
        }
        uint8_t *buf = h_alloc(LEN);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_recv_any(r->ctx, buf, LEN, tag, &req));
        /* a parked payload is taken by the posting thread, there and then,
         * not left to a wake-up of the progress thread */
        if (parks())
            H_CHECK_EQ(slime_req_bytes(req), (size_t)LEN);
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(req), (size_t)LEN);
        slime_req_free(req);
        H_CHECK_PATTERN(buf, LEN, tag, 0);
        free(buf);
        H_CHECK_EQ(copies(r->ctx) - before, (uint64_t)(parks() ? 0 : 1));
    }
    h_barrier(r);
}

/* The second message is received first: the first cannot stay in its
 * way, it is copied out when the second comes behind it. */
static void case_later_message_first(h_rank_t *r)
{
    const uint64_t tags[2] = {21, 22};
    uint64_t before = sent_before(r, tags, 2);
    if (r->rank == 1) {
        recv_one(r->ctx, r->ep[h_peer(r)], tags[1]);
        recv_one(r->ctx, r->ep[h_peer(r)], tags[0]);
        H_CHECK_EQ(copies(r->ctx) - before, (uint64_t)(parks() ? 1 : 2));
    }
    h_barrier(r);
}

/* Rank 0 sends n messages (tags first..first+n-1) and destroys its
 * context at once; rank 1 receives them all after the endpoint went down.
 * A completed send is the peer's even when the sender then leaves: over
 * verbs destroy waits for the queue pair to deliver what it took. */
static void sender_gone(h_rank_t *r, uint64_t first, int n)
{
    uint8_t blob[SLIME_ADDRESS_MAX];
    slime_ctx_t *ctx = h_ctx_create(NULL);
    if (r->rank == 0) {
        size_t len = h_ctx_address(ctx, blob);
        h_ctl_send(r, 1, blob, len);
        slime_ep_t *ep = NULL;
        H_CHECK_OK(slime_ep_accept(ctx, H_WAIT_MS, &ep));
        for (int i = 0; i < n; i++)
            send_one(ep, first + (uint64_t)i);
        slime_ctx_destroy(ctx);
        h_ctl_send_u64(r, 1, 1);
        return;
    }
    size_t len = h_ctl_recv(r, 0, blob, sizeof blob);
    slime_ep_t *ep = NULL;
    H_CHECK_OK(slime_ep_connect(ctx, blob, len, H_WAIT_MS, &ep));
    (void)h_ctl_recv_u64(r, 0);
    /* the hang-up is seen first (the endpoint goes down), then the receive */
    const int64_t start = h_now_ms();
    while (slime_ep_status(ep) == SLIME_OK) {
        if (h_now_ms() - start > H_WAIT_MS)
            h_fail(__FILE__, __LINE__, "the sender's exit not seen in %d ms", H_WAIT_MS);
        h_sleep_ms(1);
    }
    for (int i = 0; i < n; i++)
        recv_one(ctx, ep, first + (uint64_t)i);
    slime_ctx_destroy(ctx);
}

/* The one message is parked over shm when the hang-up comes. */
static void case_sender_gone(h_rank_t *r) { sender_gone(r, 31, 1); }

/* 2 MiB in 64 KiB sends: over verbs the last of them are still in the
 * queue pair when the sender's destroy begins. */
static void case_sender_gone_after_many(h_rank_t *r) { sender_gone(r, 40, 32); }

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"received_late", case_received_late, 2, false, 0},
        {"received_late_from_any", case_received_late_from_any, 2, false, 0},
        {"later_message_first", case_later_message_first, 2, false, 0},
        {"sender_gone", case_sender_gone, 2, true, 0},
        {"sender_gone_after_many", case_sender_gone_after_many, 2, true, 0},
    };
    return h_main("test_unexpected", cases, sizeof cases / sizeof cases[0], argc, argv);
}
