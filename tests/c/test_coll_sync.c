/*
 * test_coll_sync.c - a collective's sender that only sends (broadcast's
 * root, scatter's root, gather's other ranks) does not run ahead of its
 * receiver with a large message: its part completes only once the
 * receiver has taken the bytes (a rendezvous, copied once), while small
 * messages still go eagerly and complete without the receiver.  That is
 * over shm, while the communicator has no more ranks than this process
 * has cores; elsewhere the sender always goes eagerly, which the cases
 * check too (over tcp the rendezvous would only add a round trip).  And
 * a rank that only sends runs a bounded number of collectives ahead.
 */
#include "test_coll_util.h"

#include <sched.h>
#include <stdio.h>

#define SMALL 1024           /* eager at every setting */
#define LARGE (64 * H_KIB)   /* at or past DLSLIME_COLL_SYNC_MIN's default */

enum kind { BROADCAST, SCATTER, GATHER };

/* The endpoint's transport, not DLSLIME_TRANSPORT: auto picks shm here. */
static bool large_waits(h_rank_t *r)
{
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return cpus >= 2 && strcmp(slime_ep_transport(r->ep[h_peer(r)]), "shm") == 0; /* 2 ranks */
}

static slime_status_t post(slime_comm_t *comm, enum kind k, uint8_t *buf, uint8_t *all, size_t len,
                           slime_req_t **q)
{
    switch (k) {
    case BROADCAST: return slime_broadcast(comm, buf, len, 0, q);
    case SCATTER: return slime_scatter(comm, all, len, buf, 0, q);
    case GATHER: return slime_gather(comm, buf, len, all, 1, q);
    }
    return SLIME_ERR_INVAL;
}

/* Rank 0 is the one that only sends; rank 1 posts its part only once
 * rank 0 has looked at its request for a while. */
static void one(h_rank_t *r, enum kind k, size_t len, bool should_wait)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    /* a two-rank communicator over shm agrees with its peer on a shared
     * box at its first small collective: not in the timed part */
    T_RUN(slime_barrier(comm, &q_));
    uint8_t *buf = h_alloc(len), *all = h_alloc(2 * len);
    const uint64_t seed = 500 + (uint64_t)k;
    slime_req_t *q = NULL;
    if (r->rank == 0) {
        h_fill(buf, len, seed, 0);
        h_fill(all, len, seed, 0);
        h_fill(all + len, len, seed, 1);
        H_CHECK_OK(post(comm, k, buf, all, len, &q));
        h_sleep_ms(should_wait ? 50 : 0);
        /* a sender that goes eagerly finishes alone; one that waits cannot */
        if (should_wait)
            H_CHECK_EQ(slime_req_test(q), SLIME_INPROGRESS);
        else
            H_WAIT(q, SLIME_OK);
        h_ctl_send_u64(r, 1, 1);
        H_WAIT_FREE(q, SLIME_OK);
    } else {
        (void)h_ctl_recv_u64(r, 0);
        memset(buf, 0xee, len);
        memset(all, 0xee, 2 * len);
        H_CHECK_OK(post(comm, k, buf, all, len, &q));
        H_WAIT_FREE(q, SLIME_OK);
        if (k == BROADCAST) H_CHECK_PATTERN(buf, len, seed, 0);
        if (k == SCATTER) H_CHECK_PATTERN(buf, len, seed, 1);
        if (k == GATHER) H_CHECK_PATTERN(all, len, seed, 0);
    }
    h_barrier(r);
    free(buf);
    free(all);
    slime_comm_destroy(comm);
}

static void each_size(h_rank_t *r, enum kind k)
{
    one(r, k, SMALL, false);
    bool waits = large_waits(r);
    if (!waits && r->rank == 0)
        printf("[test_coll_sync] over %s: large parts go eagerly too, and are checked to\n",
               slime_ep_transport(r->ep[h_peer(r)]));
    one(r, k, LARGE, waits);
}

static void case_broadcast(h_rank_t *r) { each_size(r, BROADCAST); }
static void case_scatter(h_rank_t *r) { each_size(r, SCATTER); }
static void case_gather(h_rank_t *r) { each_size(r, GATHER); }

/* Ranks that only send in a small collective (a broadcast's root, a
 * reduce's leaves) run at most 64 collectives (COLL_AHEAD_MAX) ahead of
 * ranks that have not come yet, then wait for them: before, a root
 * broadcasting in a loop ran ahead until its receiver, holding its
 * messages, disconnected it for being over its budget. */
static bool only_sends(int rank, bool reduce)
{
    return reduce ? rank != 0 : rank == 0; /* root 0 */
}

static void run_ahead(h_rank_t *r, bool reduce)
{
    enum { N = 200 };
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const int n = r->nranks;
    const bool sends = only_sends(r->rank, reduce);
    int64_t *x = h_alloc(N * sizeof *x);
    int ahead = N;
    if (!sends) /* the others come late */
        for (int q = 0; q < n; q++)
            if (q != r->rank && only_sends(q, reduce))
                (void)h_ctl_recv_u64(r, q);
    for (int i = 0; i < N; i++) {
        x[i] = r->rank + 1 + i;
        slime_req_t *q = NULL;
        H_CHECK_OK(reduce ? slime_reduce(comm, &x[i], 1, SLIME_DT_INT64, SLIME_RED_SUM, 0, &q)
                          : slime_broadcast(comm, &x[i], sizeof x[i], 0, &q));
        if (sends && ahead == N && slime_req_wait(q, 200) == SLIME_ERR_TIMEOUT) {
            ahead = i;
            for (int p = 0; p < n; p++)
                if (p != r->rank && !only_sends(p, reduce))
                    h_ctl_send_u64(r, p, 1);
        }
        H_WAIT_FREE(q, SLIME_OK);
        if (!reduce)
            H_CHECK_EQ(x[i], 1 + i); /* root 0's */
        else if (r->rank == 0)
            H_CHECK_EQ(x[i], (int64_t)n * (n + 1) / 2 + (int64_t)n * i);
    }
    if (sends) {
        h_log("%d collectives ran before the others came", ahead);
        H_CHECK(ahead >= 1 && ahead <= 64);
    }
    free(x);
    slime_comm_destroy(comm);
}

static void case_broadcast_ahead(h_rank_t *r) { run_ahead(r, false); }
static void case_reduce_ahead(h_rank_t *r) { run_ahead(r, true); }

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"broadcast", case_broadcast, 2, false, 0},
        {"scatter", case_scatter, 2, false, 0},
        {"gather", case_gather, 2, false, 0},
        {"broadcast_ahead", case_broadcast_ahead, 3, false, 0},
        {"reduce_ahead", case_reduce_ahead, 3, false, 0},
    };
    return h_main("test_coll_sync", cases, sizeof cases / sizeof cases[0], argc, argv);
}
