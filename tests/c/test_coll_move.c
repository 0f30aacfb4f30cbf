/*
 * test_coll_move.c - the collectives that move bytes without combining
 * them, on 1 to 4 ranks: broadcast (tree and chunked chain, every root),
 * allgather (in and out of place), gather, scatter, alltoallv with
 * uneven and empty splits, barrier; and point-to-point messages in a
 * communicator's tag space, with ANY_SOURCE.  Every byte is checked
 * against the pattern its sender wrote.
 */
#include "test_coll_util.h"

#include <poll.h>

/* The pattern stream of (sender, purpose). */
static uint64_t seed_of(int rank, int what)
{
    return 1000 + (uint64_t)rank * 64 + (uint64_t)what;
}

static const size_t sizes[] = {0, 1, 13, 4097, 70001, 3 * H_MIB + 11};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static void broadcast(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    for (size_t s = 0; s < NSIZES; s++) {
        size_t len = sizes[s];
        uint8_t *buf = h_alloc(len + 1);
        for (int root = 0; root < r->nranks; root++) {
            if (r->rank == root)
                h_fill(buf, len, seed_of(root, 1), s);
            else
                memset(buf, 0xee, len);
            T_RUN(slime_broadcast(comm, len ? buf : NULL, len, root, &q_));
            H_CHECK_PATTERN(buf, len, seed_of(root, 1), s);
        }
        free(buf);
    }
    slime_comm_destroy(comm);
}

/* slime_allgather_ptrs: every block a buffer of its own, allocated in
 * reverse rank order (so not ascending in memory) with a guard byte
 * after it; out of place, then in place (src is this rank's block). */
static void allgather_ptrs(slime_comm_t *comm, h_rank_t *r, size_t len, size_t s)
{
    const int n = r->nranks;
    uint8_t *own[H_MAX_RANKS], *src = h_alloc(len + 1);
    void *blocks[H_MAX_RANKS];
    for (int k = n - 1; k >= 0; k--) {
        own[k] = h_alloc(len + 1);
        blocks[k] = len ? own[k] : NULL;
    }
    for (int round = 0; round < 2; round++) {
        bool in_place = round == 1;
        int what = in_place ? 5 : 4;
        for (int k = 0; k < n; k++)
            memset(own[k], 0xee, len + 1);
        uint8_t *from = in_place ? own[r->rank] : src;
        h_fill(from, len, seed_of(r->rank, what), s);
        T_RUN(slime_allgather_ptrs(comm, len ? from : NULL, len, len ? blocks : NULL, &q_));
        for (int k = 0; k < n; k++) {
            H_CHECK_PATTERN(own[k], len, seed_of(k, what), s);
            H_CHECK_BYTES(own[k] + len, 1, 0xee);
        }
        if (!in_place)
            H_CHECK_PATTERN(src, len, seed_of(r->rank, what), s);
    }
    for (int k = 0; k < n; k++)
        free(own[k]);
    free(src);
}

static void allgather(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const size_t n = (size_t)r->nranks;
    for (size_t s = 0; s < NSIZES; s++) {
        size_t len = sizes[s];
        uint8_t *src = h_alloc(len + 1), *dst = h_alloc(n * len + 1);
        /* out of place */
        h_fill(src, len, seed_of(r->rank, 2), s);
        memset(dst, 0xee, n * len);
        T_RUN(slime_allgather(comm, len ? src : NULL, len, len ? dst : NULL, &q_));
        for (size_t k = 0; k < n; k++)
            H_CHECK_PATTERN(dst + k * len, len, seed_of((int)k, 2), s);
        H_CHECK_PATTERN(src, len, seed_of(r->rank, 2), s);
        /* in place: src is this rank's block of dst */
        memset(dst, 0xee, n * len);
        h_fill(dst + (size_t)r->rank * len, len, seed_of(r->rank, 3), s);
        T_RUN(slime_allgather(comm, len ? dst + (size_t)r->rank * len : NULL, len, len ? dst : NULL, &q_));
        for (size_t k = 0; k < n; k++)
            H_CHECK_PATTERN(dst + k * len, len, seed_of((int)k, 3), s);
        /* src is the next rank's block of dst, which this call receives
         * into: copied into place first, never sent from where it is */
        size_t next = ((size_t)r->rank + 1) % n;
        memset(dst, 0xee, n * len);
        h_fill(dst + next * len, len, seed_of(r->rank, 6), s);
        T_RUN(slime_allgather(comm, len ? dst + next * len : NULL, len, len ? dst : NULL, &q_));
        for (size_t k = 0; k < n; k++)
            H_CHECK_PATTERN(dst + k * len, len, seed_of((int)k, 6), s);
        allgather_ptrs(comm, r, len, s);
        free(src);
        free(dst);
    }
    slime_comm_destroy(comm);
}

/* allgather and broadcast with tiny chunks, allgather's moving by
 * one-sided reads on shm links */
static void small_chunks(h_rank_t *r)
{
    setenv("DLSLIME_COLL_CHUNK", "4096", 1);
    setenv("DLSLIME_COLL_CMA_MIN", "16384", 1);
    setenv("DLSLIME_COLL_CMA_COPY_MIN", "16384", 1);
    allgather(r);
    broadcast(r);
}

/* A rank the kernel refuses CMA (seccomp) still gets every byte of the
 * rings that read by default on shm (coll/tuning.c: with more ranks than
 * cores, allgather from 128 KiB and all_reduce from 1 MiB; else from 4
 * and 2 MiB): its reads fall back to the frames path. */
static void refused_cma(h_rank_t *r)
{
    if (r->rank == 1)
        h_refuse_cma();
    allgather(r);
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 3 * H_MIB / 4 + 5);
    slime_comm_destroy(comm);
}

/* slime_gather_ptrs / slime_scatter_ptrs: the root's blocks each a
 * buffer of its own, allocated in reverse rank order, with a guard byte
 * after each; then in place (the root's own block is its src / dst). */
static void gather_scatter_ptrs(slime_comm_t *comm, h_rank_t *r, size_t len, size_t s, int root)
{
    const int n = r->nranks;
    bool here = r->rank == root;
    uint8_t *own[H_MAX_RANKS], *one = h_alloc(len + 1);
    void *blocks[H_MAX_RANKS];
    for (int k = n - 1; k >= 0; k--) {
        own[k] = h_alloc(len + 1);
        blocks[k] = own[k];
    }
    for (int round = 0; round < 2; round++) {
        bool in_place = round == 1 && here;
        for (int k = 0; k < n; k++)
            memset(own[k], 0xee, len + 1);
        uint8_t *mine = in_place ? own[r->rank] : one;
        h_fill(mine, len, seed_of(r->rank, 7 + round), s);
        T_RUN(slime_gather_ptrs(comm, len ? mine : NULL, len, here && len ? blocks : NULL, root, &q_));
        for (int k = 0; here && k < n; k++) {
            H_CHECK_PATTERN(own[k], len, seed_of(k, 7 + round), s);
            H_CHECK_BYTES(own[k] + len, 1, 0xee);
        }
        memset(one, 0xee, len + 1);
        for (int k = 0; here && k < n; k++)
            h_fill(own[k], len, seed_of(k, 9 + round), s);
        mine = in_place ? own[r->rank] : one;
        T_RUN(slime_scatter_ptrs(comm, here && len ? (const void *const *)blocks : NULL, len, len ? mine : NULL,
                                 root, &q_));
        H_CHECK_PATTERN(mine, len, seed_of(r->rank, 9 + round), s);
        H_CHECK_BYTES(mine + len, 1, 0xee);
    }
    for (int k = 0; k < n; k++)
        free(own[k]);
    free(one);
}

static void gather_scatter(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const size_t n = (size_t)r->nranks;
    for (size_t s = 0; s < NSIZES - 1; s++) {
        size_t len = sizes[s];
        uint8_t *one = h_alloc(len + 1), *all = h_alloc(n * len + 1);
        for (int root = 0; root < r->nranks; root++) {
            /* gather: dst matters only at the root, so others pass NULL */
            h_fill(one, len, seed_of(r->rank, 4), s);
            memset(all, 0xee, n * len);
            bool here = r->rank == root;
            T_RUN(slime_gather(comm, len ? one : NULL, len, here && len ? all : NULL, root, &q_));
            if (here)
                for (size_t k = 0; k < n; k++)
                    H_CHECK_PATTERN(all + k * len, len, seed_of((int)k, 4), s);
            /* scatter: block k of the root's src goes to rank k */
            if (here)
                for (size_t k = 0; k < n; k++)
                    h_fill(all + k * len, len, seed_of((int)k, 5), s);
            memset(one, 0xee, len);
            T_RUN(slime_scatter(comm, here && len ? all : NULL, len, len ? one : NULL, root, &q_));
            H_CHECK_PATTERN(one, len, seed_of(r->rank, 5), s);
            /* in place at the root: its own block stays where it is */
            if (here) {
                h_fill(all, n * len, seed_of(root, 6), s);
                T_RUN(slime_scatter(comm, len ? all : NULL, len, len ? all + (size_t)root * len : NULL, root, &q_));
                H_CHECK_PATTERN(all, n * len, seed_of(root, 6), s);
            } else {
                T_RUN(slime_scatter(comm, NULL, len, len ? one : NULL, root, &q_));
                H_CHECK_PATTERN(one, len, seed_of(root, 6), s + (size_t)r->rank * len);
            }
            gather_scatter_ptrs(comm, r, len, s, root);
        }
        free(one);
        free(all);
    }
    slime_comm_destroy(comm);
}

/* Bytes rank `from` sends rank `to` in round k: uneven, some empty. */
static size_t a2a_len(int from, int to, int k)
{
    if ((from + 2 * to + k) % 4 == 0)
        return 0;
    size_t base = k == 2 ? 300 * H_KIB : 100;
    return base + (size_t)(from * 37 + to * 101 + k * 7) % 997;
}

static void alltoallv(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const int n = r->nranks;
    for (int k = 0; k < 4; k++) {
        size_t sb[H_MAX_RANKS], so[H_MAX_RANKS], rb[H_MAX_RANKS], ro[H_MAX_RANKS];
        size_t stot = 0, rtot = 0;
        /* scattered offsets: blocks out of order, with gaps */
        for (int p = n - 1; p >= 0; p--) {
            sb[p] = a2a_len(r->rank, p, k);
            so[p] = stot + 5;
            stot += sb[p] + 5;
            rb[p] = a2a_len(p, r->rank, k);
            ro[p] = rtot + 3;
            rtot += rb[p] + 3;
        }
        if (k == 3) /* everything empty */
            for (int p = 0; p < n; p++)
                sb[p] = rb[p] = 0;
        uint8_t *src = h_alloc(stot + 1), *dst = h_alloc(rtot + 1);
        for (int p = 0; p < n; p++)
            h_fill(src + so[p], sb[p], seed_of(r->rank, 10 + p), (size_t)k);
        memset(dst, 0xee, rtot);
        T_RUN(slime_alltoallv(comm, src, sb, so, dst, rb, ro, &q_));
        for (int p = 0; p < n; p++)
            H_CHECK_PATTERN(dst + ro[p], rb[p], seed_of(p, 10 + r->rank), (size_t)k);
        /* the gaps were not written */
        for (int p = 0; p < n; p++)
            H_CHECK_BYTES(dst + ro[p] - 3, 3, 0xee);
        /* the same with a buffer of its own per peer */
        const void *srcs[H_MAX_RANKS];
        void *dsts[H_MAX_RANKS];
        uint8_t *own[H_MAX_RANKS];
        for (int p = 0; p < n; p++) {
            own[p] = h_alloc(rb[p] + 1);
            memset(own[p], 0xee, rb[p] + 1);
            srcs[p] = sb[p] ? src + so[p] : NULL;
            dsts[p] = rb[p] ? own[p] : NULL;
        }
        T_RUN(slime_alltoallv_ptrs(comm, srcs, sb, dsts, rb, &q_));
        for (int p = 0; p < n; p++) {
            H_CHECK_PATTERN(own[p], rb[p], seed_of(p, 10 + r->rank), (size_t)k);
            H_CHECK_BYTES(own[p] + rb[p], 1, 0xee);
            free(own[p]);
        }
        free(src);
        free(dst);
    }
    slime_comm_destroy(comm);
}

/* A barrier lets nobody out before everyone is in: rank 0 arrives late
 * and the others must not have left before it arrived. */
static void barrier(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    for (int round = 0; round < 3; round++) {
        if (r->rank == 0) {
            h_sleep_ms(150);
            for (int k = 1; k < r->nranks; k++)
                h_ctl_send_u64(r, k, 1); /* "I am entering now" */
            T_RUN(slime_barrier(comm, &q_));
        } else {
            T_RUN(slime_barrier(comm, &q_));
            /* rank 0 announced its entry before entering: if the barrier
             * waited for it, the note is already readable */
            struct pollfd pfd = {.fd = r->ctl[0], .events = POLLIN};
            H_CHECK_EQ(poll(&pfd, 1, 0), 1);
            H_CHECK_EQ(h_ctl_recv_u64(r, 0), 1);
        }
    }
    for (int i = 0; i < 50; i++)
        T_RUN(slime_barrier(comm, &q_));
    slime_comm_destroy(comm);
}

/* slime_comm_send/recv: tags of the communicator only, ANY_SOURCE names
 * the sender, and collectives running meanwhile take nothing of it. */
static void p2p(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    slime_comm_t *other = t_comm(r, T_COMM_ID + 1, H_WAIT_MS);
    const int n = r->nranks, me = r->rank;
    enum { LEN = 3000, TAG = 42 };
    uint8_t out[LEN], in[H_MAX_RANKS][LEN];
    slime_req_t *rq[H_MAX_RANKS], *sq[H_MAX_RANKS];
    /* every rank sends to every other; receives by ANY_SOURCE */
    for (int k = 0; k < n - 1; k++)
        H_CHECK_OK(slime_comm_recv(comm, SLIME_ANY_SOURCE, in[k], LEN, TAG, &rq[k]));
    /* the same tag on the other communicator and a raw endpoint message
     * with that tag must not be taken by the receives above */
    uint8_t decoy_in[8], decoy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    slime_req_t *dq = NULL, *ds = NULL;
    int right = (me + 1) % n, left = (me + n - 1) % n;
    if (n > 1) {
        H_CHECK_OK(slime_comm_recv(other, left, decoy_in, sizeof decoy_in, TAG, &dq));
        H_CHECK_OK(slime_comm_send(other, right, decoy, sizeof decoy, TAG, &ds));
    }
    h_fill(out, LEN, seed_of(me, 20), 0);
    int ns = 0;
    for (int p = 0; p < n; p++)
        if (p != me)
            H_CHECK_OK(slime_comm_send(comm, p, out, LEN, TAG, &sq[ns++]));
    /* a collective in between */
    int64_t x = me;
    T_RUN(slime_allreduce(comm, &x, 1, SLIME_DT_INT64, SLIME_RED_SUM, &q_));
    H_CHECK_EQ(x, n * (n - 1) / 2);
    H_CHECK_OK(slime_req_wait_all(sq, (size_t)ns, H_WAIT_MS));
    bool seen[H_MAX_RANKS] = {false};
    for (int k = 0; k < n - 1; k++) {
        H_WAIT(rq[k], SLIME_OK);
        int from = slime_comm_req_source(comm, rq[k]);
        H_CHECK(from >= 0 && from < n && from != me && !seen[from]);
        seen[from] = true;
        H_CHECK_EQ(slime_req_bytes(rq[k]), LEN);
        H_CHECK_PATTERN(in[k], LEN, seed_of(from, 20), 0);
        slime_req_free(rq[k]);
        slime_req_free(sq[k]);
    }
    if (n > 1) {
        H_WAIT_FREE(ds, SLIME_OK);
        H_WAIT(dq, SLIME_OK);
        H_CHECK_EQ(slime_comm_req_source(other, dq), left);
        H_CHECK(memcmp(decoy_in, decoy, 8) == 0);
        slime_req_free(dq);

        /* a named peer and a tag using all 39 bits */
        uint64_t tag = (1ull << 39) - 1;
        uint8_t got[5] = {0};
        slime_req_t *a = NULL, *b = NULL;
        H_CHECK_OK(slime_comm_recv(comm, left, got, sizeof got, tag, &a));
        H_CHECK_OK(slime_comm_send(comm, right, "hello", 5, tag, &b));
        H_WAIT_FREE(b, SLIME_OK);
        H_WAIT(a, SLIME_OK);
        H_CHECK_EQ(slime_comm_req_source(comm, a), left);
        H_CHECK(memcmp(got, "hello", 5) == 0);
        slime_req_free(a);
    }
    h_barrier(r);
    slime_comm_destroy(other);
    slime_comm_destroy(comm);
}

/* Rank 0 sends "new!" and then BIG bytes of 0xa5 on c to rank 1, which
 * must get exactly those (never an older communicator's messages). */
static void stale_check_new(h_rank_t *r, slime_comm_t *c, uint8_t *big, size_t len, uint64_t tag)
{
    slime_req_t *q = NULL;
    if (r->rank == 0) {
        H_CHECK_OK(slime_comm_send(c, 1, "new!", 4, tag, &q));
        H_WAIT_FREE(q, SLIME_OK);
        memset(big, 0xa5, len);
        H_CHECK_OK(slime_comm_send(c, 1, big, len, tag + 1, &q));
        H_WAIT_FREE(q, SLIME_OK);
        return;
    }
    char got[8] = {0};
    H_CHECK_OK(slime_comm_recv(c, 0, got, sizeof got, tag, &q));
    H_WAIT(q, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(q), 4);
    H_CHECK(memcmp(got, "new!", 4) == 0);
    slime_req_free(q);
    memset(big, 0, len);
    H_CHECK_OK(slime_comm_recv(c, 0, big, len, tag + 1, &q));
    H_WAIT_FREE(q, SLIME_OK);
    for (size_t i = 0; i < len; i++)
        H_CHECK_EQ(big[i], 0xa5);
}

/* A communicator made again with the same id (and a new epoch) must
 * never take the old one's messages: neither those queued unmatched
 * when it was destroyed (which are dropped then: the sender of a large
 * one is told), nor those that arrive after the new one was made. */
static void stale(h_rank_t *r)
{
    enum { ID = 11, TAG = 5, BIG = 1 << 20 };
    const int me = r->rank;
    uint8_t *big = h_alloc(BIG);
    slime_req_t *old_small = NULL, *old_big = NULL;
    slime_comm_t *c = NULL;

    /* queued: the old messages arrive before the barrier's (one stream) */
    H_CHECK_OK(slime_comm_create(r->ctx, ID, 1, me, 2, r->ep, H_WAIT_MS, &c));
    if (me == 0) {
        memset(big, 0x5a, BIG);
        H_CHECK_OK(slime_comm_send(c, 1, "old!", 4, TAG, &old_small));
        H_CHECK_OK(slime_comm_send(c, 1, big, BIG, TAG + 1, &old_big));
        H_WAIT_FREE(old_small, SLIME_OK); /* eager: done once it left */
    }
    T_RUN(slime_barrier(c, &q_));
    slime_comm_destroy(c);
    H_CHECK_OK(slime_comm_create(r->ctx, ID, 2, me, 2, r->ep, H_WAIT_MS, &c));
    h_barrier(r);
    stale_check_new(r, c, big, BIG, TAG);
    if (me == 0) {
        H_WAIT(old_big, SLIME_ERR_CANCELED);
        H_CHECK(strstr(slime_req_error(old_big), "dropped") != NULL);
        slime_req_free(old_big);
    }

    /* late: rank 1 is gone from the old communicator when they come */
    h_barrier(r);
    if (me == 1) slime_comm_destroy(c);
    h_barrier(r);
    if (me == 0) {
        H_CHECK_OK(slime_comm_send(c, 1, "old!", 4, TAG, &old_small));
        H_WAIT_FREE(old_small, SLIME_OK);
        slime_comm_destroy(c);
    }
    H_CHECK_OK(slime_comm_create(r->ctx, ID, 3, me, 2, r->ep, H_WAIT_MS, &c));
    h_barrier(r);
    stale_check_new(r, c, big, BIG, TAG);
    h_barrier(r);
    slime_comm_destroy(c);
    free(big);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"broadcast_1", broadcast, 1, false, 0},   {"broadcast_2", broadcast, 2, false, 0},
        {"broadcast_3", broadcast, 3, false, 0},   {"broadcast_4", broadcast, 4, false, 0},
        {"allgather_1", allgather, 1, false, 0},   {"allgather_2", allgather, 2, false, 0},
        {"allgather_3", allgather, 3, false, 0},   {"allgather_4", allgather, 4, false, 0},
        {"small_chunks_3", small_chunks, 3, false, 0},
        {"small_chunks_4", small_chunks, 4, false, 0},
        {"refused_cma_2", refused_cma, 2, false, 0},
        {"refused_cma_3", refused_cma, 3, false, 0},
        {"gather_scatter_1", gather_scatter, 1, false, 0},
        {"gather_scatter_2", gather_scatter, 2, false, 0},
        {"gather_scatter_3", gather_scatter, 3, false, 0},
        {"gather_scatter_4", gather_scatter, 4, false, 0},
        {"alltoallv_1", alltoallv, 1, false, 0},   {"alltoallv_2", alltoallv, 2, false, 0},
        {"alltoallv_3", alltoallv, 3, false, 0},   {"alltoallv_4", alltoallv, 4, false, 0},
        {"barrier_1", barrier, 1, false, 0},       {"barrier_2", barrier, 2, false, 0},
        {"barrier_3", barrier, 3, false, 0},       {"barrier_4", barrier, 4, false, 0},
        {"p2p_2", p2p, 2, false, 0},               {"p2p_4", p2p, 4, false, 0},
        {"stale_2", stale, 2, false, 0},
    };
    return h_main("test_coll_move", cases, sizeof cases / sizeof cases[0], argc, argv);
}
