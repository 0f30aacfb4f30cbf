/*
 * test_sendrecv.c - two-sided tagged messages: sizes from 0 B to 64 MiB,
 * receive posted before or after the send, truncation, hundreds of
 * outstanding requests, ordering within a tag, recv_any and batches.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define GUARD 64
#define GUARD_BYTE 0xEE

static const size_t k_sizes[] = {
    0, 1, 3, 4096, 4097, 65537, 262145, 1 << 20, (1 << 20) + 13, 64 << 20,
};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

static uint64_t seed_of(uint64_t tag, size_t len, int sender)
{
    return tag * 1000003u + len * 31u + (uint64_t)sender;
}

/* One message from rank `sender` to the other rank, received into a
 * buffer of capacity cap followed by a guard that must stay untouched. */
static void one_message(h_rank_t *r, int sender, size_t len, size_t cap,
                        uint64_t tag, bool recv_first)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    const uint64_t seed = seed_of(tag, len, sender);
    slime_req_t *req = NULL;

    if (r->rank == sender) {
        uint8_t *buf = h_alloc(len);
        h_fill(buf, len, seed, 0);
        if (recv_first)
            (void)h_ctl_recv_u64(r, peer);
        H_CHECK_OK(slime_send(ep, buf, len, tag, &req));
        if (!recv_first)
            h_ctl_send_u64(r, peer, 1);
        H_WAIT_FREE(req, SLIME_OK);
        free(buf);
        return;
    }
    uint8_t *buf = h_alloc(cap + GUARD);
    memset(buf, GUARD_BYTE, cap + GUARD);
    if (!recv_first) {
        (void)h_ctl_recv_u64(r, peer);
        h_sleep_ms(5); /* let a small message arrive unexpected */
    }
    H_CHECK_OK(slime_recv(ep, buf, cap, tag, &req));
    if (recv_first)
        h_ctl_send_u64(r, peer, 1);
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), len);
    H_CHECK(slime_req_ep(req) == ep);
    slime_req_free(req);
    H_CHECK_PATTERN(buf, len, seed, 0);
    H_CHECK_BYTES(buf + cap, GUARD, GUARD_BYTE);
    free(buf);
}

static void sizes(h_rank_t *r, bool recv_first)
{
    for (size_t i = 0; i < NSIZES; i++) {
        for (int sender = 0; sender < 2; sender++) {
            size_t len = k_sizes[i];
            /* Exact capacity one way, room to spare the other. */
            size_t cap = sender == 0 ? len : len + 4099;
            one_message(r, sender, len, cap, 100 + i, recv_first);
        }
    }
}

static void case_sizes_recv_first(h_rank_t *r)
{
    sizes(r, true);
}

/* The default eager limits (see slime_send). */
static size_t eager_limit(void)
{
    return strcmp(h_transport(), "verbs") == 0 ? 64 * H_KIB : 256 * H_KIB;
}

static void case_sizes_recv_after(h_rank_t *r)
{
    sizes(r, false);
}

/* A message longer than the receive buffer fails the receive, leaves the
 * bytes past the buffer alone, and the endpoint keeps working.  The send
 * fails too when the message went by rendezvous (above the eager limit:
 * 256 KiB on shm and tcp, 64 KiB on verbs); an eager send has completed already. */
static void truncated(h_rank_t *r, size_t len, size_t cap, uint64_t tag,
                      bool recv_first)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    slime_req_t *req = NULL;

    if (r->rank == 0) {
        uint8_t *buf = h_alloc(len);
        h_fill(buf, len, tag, 0);
        if (recv_first)
            (void)h_ctl_recv_u64(r, peer);
        H_CHECK_OK(slime_send(ep, buf, len, tag, &req));
        if (!recv_first)
            h_ctl_send_u64(r, peer, 1);
        H_WAIT_FREE(req, len > eager_limit() ? SLIME_ERR_TRUNCATED : SLIME_OK);
        free(buf);
    } else {
        uint8_t *buf = h_alloc(cap + GUARD);
        memset(buf, GUARD_BYTE, cap + GUARD);
        if (!recv_first) {
            (void)h_ctl_recv_u64(r, peer);
            h_sleep_ms(5);
        }
        H_CHECK_OK(slime_recv(ep, buf, cap, tag, &req));
        if (recv_first)
            h_ctl_send_u64(r, peer, 1);
        H_WAIT_FREE(req, SLIME_ERR_TRUNCATED);
        H_CHECK_BYTES(buf + cap, GUARD, GUARD_BYTE);
        free(buf);
    }
    H_CHECK_OK(slime_ep_status(ep));
    one_message(r, 0, 777, 777, tag, true);
    one_message(r, 1, 5, 5, tag, false);
}

static void case_truncation(h_rank_t *r)
{
    for (int first = 0; first < 2; first++) {
        truncated(r, 4097, 4096, 7, first);
        truncated(r, 1, 0, 8, first);
        truncated(r, (1 << 20) + 13, 65536, 9, first);
        truncated(r, 64 << 20, (64 << 20) - 1, 10, first);
    }
}

#define NMANY 500
#define MANY_TAG 42

static size_t many_len(int i)
{
    if (i % 50 == 49)
        return 256 * H_KIB + (size_t)i;
    return ((size_t)i * 7919u) % 9001u;
}

/* Both ranks at once: half the receives posted before any send, all 500
 * sends posted without waiting, the other half of the receives after, then
 * one wait for the 1000 requests.  One tag, so receive i must get send i. */
static void case_many_outstanding(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t *out[NMANY], *in[NMANY];
    slime_req_t *reqs[2 * NMANY] = {NULL};
    size_t nreq = 0;

    for (int i = 0; i < NMANY; i++) {
        out[i] = h_alloc(many_len(i));
        h_fill(out[i], many_len(i), seed_of(MANY_TAG, (size_t)i, r->rank), 0);
        in[i] = h_alloc(many_len(i) + GUARD);
        memset(in[i], GUARD_BYTE, many_len(i) + GUARD);
    }
    for (int i = 0; i < NMANY / 2; i++)
        H_CHECK_OK(slime_recv(ep, in[i], many_len(i), MANY_TAG,
                              &reqs[nreq++]));
    h_barrier(r);
    for (int i = 0; i < NMANY; i++)
        H_CHECK_OK(slime_send(ep, out[i], many_len(i), MANY_TAG,
                              &reqs[nreq++]));
    for (int i = NMANY / 2; i < NMANY; i++)
        H_CHECK_OK(slime_recv(ep, in[i], many_len(i), MANY_TAG,
                              &reqs[nreq++]));
    H_CHECK_OK(slime_req_wait_all(reqs, nreq, H_WAIT_MS));

    /* Receives sit at [0, 250) and [750, 1000) of reqs. */
    for (int i = 0; i < NMANY; i++) {
        slime_req_t *rr = reqs[i < NMANY / 2 ? i : i + NMANY];
        H_CHECK_OK(slime_req_test(rr));
        H_CHECK_EQ(slime_req_bytes(rr), many_len(i));
        H_CHECK_PATTERN(in[i], many_len(i),
                        seed_of(MANY_TAG, (size_t)i, peer), 0);
        H_CHECK_BYTES(in[i] + many_len(i), GUARD, GUARD_BYTE);
    }
    for (size_t i = 0; i < nreq; i++)
        slime_req_free(reqs[i]);
    for (int i = 0; i < NMANY; i++) {
        free(out[i]);
        free(in[i]);
    }
}

/* Within one tag a small message never overtakes a large one sent first,
 * whatever path each size takes. */
static void case_order_mixed_sizes(h_rank_t *r)
{
    static const size_t lens[] = {8 << 20, 1, 4 << 20, 0, 65537, 3};
    enum { N = sizeof lens / sizeof lens[0], TAG = 77 };
    const size_t cap = 8 << 20;
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    slime_req_t *reqs[N] = {NULL};
    uint8_t *bufs[N];

    if (r->rank == 0) {
        for (int i = 0; i < N; i++) {
            bufs[i] = h_alloc(lens[i]);
            h_fill(bufs[i], lens[i], seed_of(TAG, (size_t)i, 0), 0);
            H_CHECK_OK(slime_send(ep, bufs[i], lens[i], TAG, &reqs[i]));
        }
        h_ctl_send_u64(r, peer, 1);
    } else {
        (void)h_ctl_recv_u64(r, peer);
        h_sleep_ms(20);
        for (int i = 0; i < N; i++) {
            bufs[i] = h_alloc(cap);
            H_CHECK_OK(slime_recv(ep, bufs[i], cap, TAG, &reqs[i]));
        }
    }
    H_CHECK_OK(slime_req_wait_all(reqs, N, H_WAIT_MS));
    for (int i = 0; i < N; i++) {
        if (r->rank == 1) {
            H_CHECK_EQ(slime_req_bytes(reqs[i]), lens[i]);
            H_CHECK_PATTERN(bufs[i], lens[i], seed_of(TAG, (size_t)i, 0), 0);
        }
        slime_req_free(reqs[i]);
        free(bufs[i]);
    }
}

/* Rank 0 receives from ranks 1 and 2 with recv_any: each message names its
 * sender, and each sender's messages arrive in the order sent.  A message
 * with another tag is left for a plain receive. */
static void case_recv_any(h_rank_t *r)
{
    enum { PER_SENDER = 4, TAG = 5, OTHER_TAG = 6, CAP = 80000 };
    if (r->rank != 0) {
        uint8_t *other = h_alloc(100);
        h_fill(other, 100, seed_of(OTHER_TAG, 100, r->rank), 0);
        slime_req_t *oreq = NULL;
        H_CHECK_OK(slime_send(r->ep[0], other, 100, OTHER_TAG, &oreq));
        uint8_t *bufs[PER_SENDER];
        slime_req_t *reqs[PER_SENDER];
        (void)h_ctl_recv_u64(r, 0); /* half of rank 0's receives posted */
        for (int i = 0; i < PER_SENDER; i++) {
            size_t len = 1000u * (size_t)(i + 1) * (size_t)r->rank + 65536u * (i == 3);
            bufs[i] = h_alloc(len);
            h_fill(bufs[i], len, seed_of(TAG, (size_t)i, r->rank), 0);
            H_CHECK_OK(slime_send(r->ep[0], bufs[i], len, TAG, &reqs[i]));
        }
        H_CHECK_OK(slime_req_wait_all(reqs, PER_SENDER, H_WAIT_MS));
        H_WAIT_FREE(oreq, SLIME_OK);
        for (int i = 0; i < PER_SENDER; i++) {
            slime_req_free(reqs[i]);
            free(bufs[i]);
        }
        free(other);
        return;
    }
    enum { N = 2 * PER_SENDER };
    uint8_t *bufs[N];
    slime_req_t *reqs[N];
    for (int i = 0; i < N; i++)
        bufs[i] = h_alloc(CAP);
    for (int i = 0; i < N / 2; i++)
        H_CHECK_OK(slime_recv_any(r->ctx, bufs[i], CAP, TAG, &reqs[i]));
    h_ctl_send_u64(r, 1, 1);
    h_ctl_send_u64(r, 2, 1);
    h_sleep_ms(20);
    for (int i = N / 2; i < N; i++)
        H_CHECK_OK(slime_recv_any(r->ctx, bufs[i], CAP, TAG, &reqs[i]));
    H_CHECK_OK(slime_req_wait_all(reqs, N, H_WAIT_MS));
    int next[3] = {0, 0, 0};
    for (int i = 0; i < N; i++) {
        slime_ep_t *from = slime_req_ep(reqs[i]);
        int s = from == r->ep[1] ? 1 : from == r->ep[2] ? 2 : -1;
        H_CHECK(s > 0);
        int idx = next[s]++;
        size_t len = 1000u * (size_t)(idx + 1) * (size_t)s + 65536u * (idx == 3);
        H_CHECK_EQ(slime_req_bytes(reqs[i]), len);
        H_CHECK_PATTERN(bufs[i], len, seed_of(TAG, (size_t)idx, s), 0);
        slime_req_free(reqs[i]);
        free(bufs[i]);
    }
    H_CHECK_EQ(next[1], PER_SENDER);
    H_CHECK_EQ(next[2], PER_SENDER);
    for (int s = 1; s <= 2; s++) {
        uint8_t other[100];
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_recv(r->ep[s], other, sizeof other, OTHER_TAG, &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(req), 100);
        H_CHECK(slime_req_ep(req) == r->ep[s]);
        slime_req_free(req);
        H_CHECK_PATTERN(other, 100, seed_of(OTHER_TAG, 100, s), 0);
    }
}

/* A batch of sends against a batch of receives, one request each side. */
static void case_batch(h_rank_t *r)
{
    enum { N = 128 };
    const int peer = h_peer(r);
    slime_op_t ops[N];
    uint8_t *bufs[N];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < N; i++) {
        size_t len = (size_t)i * 513u + (i == N - 1 ? 2u << 20 : 0u);
        bufs[i] = h_alloc(len + GUARD);
        ops[i].ep = r->ep[peer];
        ops[i].len = len;
        ops[i].buf = bufs[i];
        ops[i].tag = 9000u + (uint64_t)i;
        if (r->rank == 0) {
            ops[i].kind = SLIME_OP_SEND;
            h_fill(bufs[i], len, seed_of(ops[i].tag, len, 0), 0);
        } else {
            ops[i].kind = SLIME_OP_RECV;
            memset(bufs[i], GUARD_BYTE, len + GUARD);
        }
    }
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_batch(r->ctx, ops, N, &req));
    H_WAIT_FREE(req, SLIME_OK);
    for (int i = 0; i < N; i++) {
        if (r->rank == 1) {
            H_CHECK_PATTERN(bufs[i], ops[i].len,
                            seed_of(ops[i].tag, ops[i].len, 0), 0);
            H_CHECK_BYTES(bufs[i] + ops[i].len, GUARD, GUARD_BYTE);
        }
        free(bufs[i]);
    }
}

/* slime_req_test alone (no wait) drives a transfer to completion. */
static void case_test_polling(h_rank_t *r)
{
    const int peer = h_peer(r);
    const size_t len = 3u << 20;
    uint8_t *buf = h_alloc(len);
    slime_req_t *req = NULL;
    if (r->rank == 0) {
        h_fill(buf, len, 31337, 0);
        H_CHECK_OK(slime_send(r->ep[peer], buf, len, 1, &req));
    } else {
        H_CHECK_OK(slime_recv(r->ep[peer], buf, len, 1, &req));
    }
    const int64_t deadline = h_now_ms() + H_WAIT_MS;
    slime_status_t s;
    while ((s = slime_req_test(req)) == SLIME_INPROGRESS) {
        H_CHECK(h_now_ms() < deadline);
        H_CHECK_EQ(slime_req_error(req)[0], 0);
    }
    H_CHECK_STATUS(s, SLIME_OK);
    H_CHECK_STATUS(slime_req_test(req), SLIME_OK);
    H_CHECK_STATUS(slime_req_wait(req, 0), SLIME_OK);
    if (r->rank == 1) {
        H_CHECK_EQ(slime_req_bytes(req), len);
        H_CHECK_PATTERN(buf, len, 31337, 0);
    }
    slime_req_free(req);
    free(buf);
}

/* Large receives on shm bypass the cache with 16-byte streaming stores
 * once 4 MiB or more are still to come, memcpy for the rest: sizes
 * around that limit, into destinations at odd addresses (the stores
 * need 16-byte alignment, reached by a memcpy head), must land byte for
 * byte, with the bytes on either side untouched. */
static void case_stream_edges(h_rank_t *r)
{
    static const size_t lens[] = {(4u << 20) - 1, 4u << 20, (4u << 20) + 1, (4u << 20) + 63, (9u << 20) + 17};
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (size_t mis = 0; mis < 16; mis += 5) {
            const size_t len = lens[i];
            const uint64_t tag = 500 + i * 16 + mis, seed = seed_of(tag, len, 0);
            slime_req_t *req = NULL;
            if (r->rank == 0) {
                uint8_t *buf = h_alloc(len + mis);
                h_fill(buf + mis, len, seed, 0);
                H_CHECK_OK(slime_send(ep, buf + mis, len, tag, &req));
                H_WAIT_FREE(req, SLIME_OK);
                free(buf);
                continue;
            }
            uint8_t *buf = h_alloc(GUARD + mis + len + GUARD);
            memset(buf, GUARD_BYTE, GUARD + mis + len + GUARD);
            uint8_t *dst = buf + GUARD + mis;
            H_CHECK_OK(slime_recv(ep, dst, len, tag, &req));
            H_WAIT(req, SLIME_OK);
            H_CHECK_EQ(slime_req_bytes(req), len);
            slime_req_free(req);
            H_CHECK_PATTERN(dst, len, seed, 0);
            H_CHECK_BYTES(buf, GUARD + mis, GUARD_BYTE);
            H_CHECK_BYTES(dst + len, GUARD, GUARD_BYTE);
            free(buf);
        }
    }
}

/* Over shm a message travels as packets in a ring, each starting at a
 * line that the reader polls: a large message leaves its payload on lines
 * where the next lap's small messages start, and the writer must clear
 * those before the reader can take old payload for a header (the reader
 * fails the connection on a header that no writer leaves).  Rounds of a
 * large message then many small ones of every length, several laps of the
 * default 512 KiB ring, each received whole and checked. */
static void case_laps_mixed_sizes(h_rank_t *r)
{
    enum { ROUNDS = 12, SMALL = 300, TAG = 90 };
    const size_t large = 3 * 65536 + 1000;
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t *buf = h_alloc(large);
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i <= SMALL; i++) {
            const size_t len = i == 0 ? large : (size_t)(i % 97) + 1;
            const uint64_t seed = seed_of(TAG, (size_t)(round * 1000 + i), 0);
            slime_req_t *req = NULL;
            if (r->rank == 0) {
                h_fill(buf, len, seed, 0);
                H_CHECK_OK(slime_send(ep, buf, len, TAG, &req));
                H_WAIT_FREE(req, SLIME_OK);
                continue;
            }
            H_CHECK_OK(slime_recv(ep, buf, large, TAG, &req));
            H_WAIT(req, SLIME_OK);
            H_CHECK_EQ(slime_req_bytes(req), len);
            slime_req_free(req);
            H_CHECK_PATTERN(buf, len, seed, 0);
        }
    }
    free(buf);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"sizes_recv_first", case_sizes_recv_first, 2, false, 0},
        {"sizes_recv_after", case_sizes_recv_after, 2, false, 0},
        {"truncation", case_truncation, 2, false, 0},
        {"many_outstanding", case_many_outstanding, 2, false, 0},
        {"order_mixed_sizes", case_order_mixed_sizes, 2, false, 0},
        {"recv_any", case_recv_any, 3, false, 0},
        {"batch", case_batch, 2, false, 0},
        {"test_polling", case_test_polling, 2, false, 0},
        {"stream_edges", case_stream_edges, 2, false, 0},
        {"laps_mixed_sizes", case_laps_mixed_sizes, 2, false, 0},
    };
    return h_main("test_sendrecv", cases, sizeof cases / sizeof cases[0],
                  argc, argv);
}
