/*
 * test_tags.c - tag matching: receives posted in the reverse order of the
 * sends (before and after they arrive), many tags interleaved, tags that
 * need all 64 bits, and both directions sharing tags.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static uint64_t seed_of(uint64_t tag, int index, int sender)
{
    return tag * 0x9E3779B1u + (uint64_t)index * 131u + (uint64_t)sender;
}

/* Large messages sit between small ones so every send path gets passed. */
static size_t reverse_len(int tag)
{
    return tag % 8 == 0 ? 512 * H_KIB + (size_t)tag : (size_t)tag * 97u;
}

enum { NREV = 64 };

/* Receives posted after everything was sent, newest tag first, each one
 * waited for before the next is posted: a message nobody asked for yet
 * must not block one that was asked for. */
static void case_reverse_after(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    if (r->rank == 0) {
        uint8_t *bufs[NREV + 1];
        slime_req_t *reqs[NREV];
        for (int t = 1; t <= NREV; t++) {
            bufs[t] = h_alloc(reverse_len(t));
            h_fill(bufs[t], reverse_len(t), seed_of((uint64_t)t, 0, 0), 0);
            H_CHECK_OK(slime_send(ep, bufs[t], reverse_len(t), (uint64_t)t,
                                  &reqs[t - 1]));
        }
        h_ctl_send_u64(r, peer, 1);
        H_CHECK_OK(slime_req_wait_all(reqs, NREV, H_WAIT_MS));
        for (int t = 1; t <= NREV; t++) {
            slime_req_free(reqs[t - 1]);
            free(bufs[t]);
        }
        return;
    }
    (void)h_ctl_recv_u64(r, peer);
    h_sleep_ms(20);
    for (int t = NREV; t >= 1; t--) {
        size_t len = reverse_len(t);
        uint8_t *buf = h_alloc(len + 1);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_recv(ep, buf, len + 1, (uint64_t)t, &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(req), len);
        H_CHECK_PATTERN(buf, len, seed_of((uint64_t)t, 0, 0), 0);
        slime_req_free(req);
        free(buf);
    }
}

/* Receives posted first, newest tag first; sends follow in tag order. */
static void case_reverse_before(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t *bufs[NREV + 1];
    slime_req_t *reqs[NREV];
    if (r->rank == 1) {
        for (int t = NREV; t >= 1; t--) {
            bufs[t] = h_alloc(reverse_len(t));
            H_CHECK_OK(slime_recv(ep, bufs[t], reverse_len(t), (uint64_t)t,
                                  &reqs[NREV - t]));
        }
        h_ctl_send_u64(r, peer, 1);
    } else {
        (void)h_ctl_recv_u64(r, peer);
        for (int t = 1; t <= NREV; t++) {
            bufs[t] = h_alloc(reverse_len(t));
            h_fill(bufs[t], reverse_len(t), seed_of((uint64_t)t, 0, 0), 0);
            H_CHECK_OK(slime_send(ep, bufs[t], reverse_len(t), (uint64_t)t,
                                  &reqs[t - 1]));
        }
    }
    H_CHECK_OK(slime_req_wait_all(reqs, NREV, H_WAIT_MS));
    for (int t = 1; t <= NREV; t++) {
        if (r->rank == 1) {
            H_CHECK_EQ(slime_req_bytes(reqs[NREV - t]), reverse_len(t));
            H_CHECK_PATTERN(bufs[t], reverse_len(t),
                            seed_of((uint64_t)t, 0, 0), 0);
        }
        free(bufs[t]);
    }
    for (int i = 0; i < NREV; i++)
        slime_req_free(reqs[i]);
}

enum { NTAGS = 16, NROUNDS = 20 };

static size_t interleaved_len(int t, int round)
{
    size_t len = ((size_t)t * 131u + (size_t)round * 17u) % 3000u;
    if (round == NROUNDS - 1 && t % 4 == 0)
        len += 300000u;
    return len;
}

/* The sender goes round-robin over 16 tags; the receiver drains tag after
 * tag in a shuffled order.  Each tag keeps its own order. */
static void case_interleaved(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t *bufs[NTAGS][NROUNDS];
    slime_req_t *reqs[NTAGS * NROUNDS];
    size_t n = 0;

    if (r->rank == 0) {
        for (int round = 0; round < NROUNDS; round++) {
            for (int t = 0; t < NTAGS; t++) {
                size_t len = interleaved_len(t, round);
                bufs[t][round] = h_alloc(len);
                h_fill(bufs[t][round], len, seed_of((uint64_t)t, round, 0), 0);
                H_CHECK_OK(slime_send(ep, bufs[t][round], len, (uint64_t)t,
                                      &reqs[n++]));
            }
        }
        H_CHECK_OK(slime_req_wait_all(reqs, n, H_WAIT_MS));
    } else {
        /* Half the tags are posted before the sends start, half after. */
        for (int k = 0; k < NTAGS; k++) {
            int t = (k * 7) % NTAGS;
            if (k == NTAGS / 2)
                h_sleep_ms(10);
            for (int round = 0; round < NROUNDS; round++) {
                size_t cap = interleaved_len(t, round) + 1;
                bufs[t][round] = h_alloc(cap);
                H_CHECK_OK(slime_recv(ep, bufs[t][round], cap, (uint64_t)t,
                                      &reqs[n++]));
            }
        }
        H_CHECK_OK(slime_req_wait_all(reqs, n, H_WAIT_MS));
        n = 0;
        for (int k = 0; k < NTAGS; k++) {
            int t = (k * 7) % NTAGS;
            for (int round = 0; round < NROUNDS; round++) {
                size_t len = interleaved_len(t, round);
                H_CHECK_EQ(slime_req_bytes(reqs[n++]), len);
                H_CHECK_PATTERN(bufs[t][round], len,
                                seed_of((uint64_t)t, round, 0), 0);
            }
        }
    }
    for (size_t i = 0; i < NTAGS * NROUNDS; i++)
        slime_req_free(reqs[i]);
    for (int t = 0; t < NTAGS; t++)
        for (int round = 0; round < NROUNDS; round++)
            free(bufs[t][round]);
}

/* Tags that differ only in their high bits must not be confused. */
static void case_wide_tags(h_rank_t *r)
{
    static const uint64_t tags[] = {
        0, 1, UINT32_MAX, (uint64_t)1 << 32, ((uint64_t)1 << 32) + 1,
        (uint64_t)1 << 63, UINT64_MAX, UINT64_MAX - 1,
    };
    enum { N = sizeof tags / sizeof tags[0], LEN = 256 };
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t bufs[N][LEN];
    slime_req_t *reqs[N];

    if (r->rank == 0) {
        for (int i = 0; i < N; i++) {
            h_fill(bufs[i], LEN, seed_of(tags[i], i, 0), 0);
            H_CHECK_OK(slime_send(ep, bufs[i], LEN, tags[i], &reqs[i]));
        }
        H_CHECK_OK(slime_req_wait_all(reqs, N, H_WAIT_MS));
        for (int i = 0; i < N; i++)
            slime_req_free(reqs[i]);
        return;
    }
    for (int i = N - 1; i >= 0; i--) {
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_recv(ep, bufs[i], LEN, tags[i], &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(req), LEN);
        H_CHECK_PATTERN(bufs[i], LEN, seed_of(tags[i], i, 0), 0);
        slime_req_free(req);
    }
}

/* Both ranks send and receive on the same tags at once: the two
 * directions match independently. */
static void case_both_directions(h_rank_t *r)
{
    enum { N = 8 };
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    uint8_t *out[N], *in[N];
    slime_req_t *reqs[2 * N];
    for (int t = 0; t < N; t++) {
        size_t len = 1000u + (size_t)t * 100000u;
        out[t] = h_alloc(len);
        in[t] = h_alloc(len);
        h_fill(out[t], len, seed_of((uint64_t)t, 0, r->rank), 0);
    }
    for (int t = N - 1; t >= 0; t--)
        H_CHECK_OK(slime_recv(ep, in[t], 1000u + (size_t)t * 100000u,
                              (uint64_t)t, &reqs[N + t]));
    for (int t = 0; t < N; t++)
        H_CHECK_OK(slime_send(ep, out[t], 1000u + (size_t)t * 100000u,
                              (uint64_t)t, &reqs[t]));
    H_CHECK_OK(slime_req_wait_all(reqs, 2 * N, H_WAIT_MS));
    for (int t = 0; t < N; t++) {
        size_t len = 1000u + (size_t)t * 100000u;
        H_CHECK_EQ(slime_req_bytes(reqs[N + t]), len);
        H_CHECK_PATTERN(in[t], len, seed_of((uint64_t)t, 0, peer), 0);
        slime_req_free(reqs[t]);
        slime_req_free(reqs[N + t]);
        free(out[t]);
        free(in[t]);
    }
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"reverse_after", case_reverse_after, 2, false, 0},
        {"reverse_before", case_reverse_before, 2, false, 0},
        {"interleaved", case_interleaved, 2, false, 0},
        {"wide_tags", case_wide_tags, 2, false, 0},
        {"both_directions", case_both_directions, 2, false, 0},
    };
    return h_main("test_tags", cases, sizeof cases / sizeof cases[0], argc,
                  argv);
}
