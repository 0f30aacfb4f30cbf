/*
 * test_pair_box.c - two ranks on one host move small collectives through
 * a shared box (csrc/coll/pairbox.c, pairbox_ops.c).  SLIME_COUNTER_BOX_OPS
 * proves which path ran: over shm every small allreduce, broadcast,
 * allgather, reduce_scatter and barrier goes through the box and a
 * larger one does not; over tcp none does.  Results are checked against
 * the reference: split into several messages, in communicators beyond
 * the slots a connection has, in a slot an earlier communicator left
 * stale messages in, with one rank refusing boxes, and with the peer
 * killed while a rank waits on the box.
 */
#include "test_coll_util.h"

#include <stdio.h>
#include <time.h>

static uint64_t box_ops(h_rank_t *r)
{
    return slime_ctx_counter(r->ctx, SLIME_COUNTER_BOX_OPS);
}

static bool over_shm(void)
{
    return strcmp(h_transport(), "shm") == 0;
}

/* Every dtype and op at sizes up to the box's limit: each one is a box
 * op over shm (none over tcp); one past the limit is not. */
static void small_ones_take_the_box(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r), ran = 0;
    for (size_t d = 0; d < T_NDTYPES; d++) {
        slime_dtype_t dt = t_dtypes[d];
        const size_t counts[] = {1, 7, 4096 / slime_dtype_size(dt)};
        for (size_t o = 0; o < T_NOPS; o++) {
            if (!t_applies(t_ops[o], dt))
                continue;
            for (size_t c = 0; c < 3; c++, ran++)
                t_allreduce_checked(comm, r->nranks, r->rank, dt, t_ops[o], counts[c]);
        }
    }
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? ran : 0);
    before = box_ops(r);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 4096 / 4 + 1);
    H_CHECK_EQ(box_ops(r) - before, 0);
    slime_comm_destroy(comm);
}

/* With a larger limit, one allreduce spans several messages of the box,
 * both buffers of each side in turn. */
static void several_messages(h_rank_t *r)
{
    setenv("DLSLIME_PAIR_BOX_MAX", "65536", 1);
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r);
    for (int i = 0; i < 20; i++) {
        t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 16384 - 3 * i);
        t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT64, SLIME_RED_AVG, 5000 + i);
        t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_INT8, SLIME_RED_MAX, 3);
    }
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? 60 : 0);
    slime_comm_destroy(comm);
}

/* More communicators than a connection has slots: the first ones get
 * boxes, the rest fall back to messages, and all agree on which.  Then
 * every other one goes, and new ones take the freed slots, where the
 * old messages still lie. */
static void more_comms_than_slots(h_rank_t *r)
{
    enum { N = 11 };
    slime_comm_t *comms[N];
    for (int i = 0; i < N; i++)
        comms[i] = t_comm(r, 100 + (uint32_t)i, H_WAIT_MS);
    uint64_t before = box_ops(r);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < N; i++)
            t_allreduce_checked(comms[i], r->nranks, r->rank, SLIME_DT_INT32, SLIME_RED_SUM, 10 + (size_t)i);
    uint64_t boxed = box_ops(r) - before;
    h_log("%llu of %d allreduces went through a box", (unsigned long long)boxed, 3 * N);
    if (over_shm()) {
        H_CHECK(boxed >= 3 * 4 && boxed < 3 * N); /* some got slots, not all */
        H_CHECK_EQ(boxed % 3, 0);                  /* a communicator keeps its path */
    } else {
        H_CHECK_EQ(boxed, 0);
    }
    for (int i = 0; i < N; i += 2) {
        slime_comm_destroy(comms[i]);
        comms[i] = t_comm(r, 200 + (uint32_t)i, H_WAIT_MS);
    }
    before = box_ops(r);
    for (int i = 0; i < N; i++)
        t_allreduce_checked(comms[i], r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 1 + (size_t)i);
    if (over_shm())
        H_CHECK(box_ops(r) - before >= 4);
    for (int i = 0; i < N; i++)
        slime_comm_destroy(comms[i]);
}

/* One rank refuses boxes: both use messages, and still agree. */
static void one_rank_refuses(h_rank_t *r)
{
    if (r->rank == 1)
        setenv("DLSLIME_PAIR_BOX", "0", 1);
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r);
    for (int i = 0; i < 50; i++)
        t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 1 + (size_t)i);
    H_CHECK_EQ(box_ops(r) - before, 0);
    slime_comm_destroy(comm);
}

/* Rank 1 is killed while rank 0 waits on the box: rank 0's allreduce
 * fails with PEER_LOST well before its timeout, and so does the next. */
static void peer_killed_in_the_box(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 2);
    if (r->rank == 1) {
        h_ctl_send_u64(r, 0, 1);
        for (;;)
            h_sleep_ms(1000);
    }
    (void)h_ctl_recv_u64(r, 1);
    float x[2] = {1, 2};
    slime_req_t *q = NULL;
    H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
    h_sleep_ms(50); /* rank 0 is asleep in the box by now */
    int64_t killed_at = h_now_ms();
    h_kill_rank(r, 1);
    slime_status_t s = slime_req_wait(q, 10000);
    int64_t took = h_now_ms() - killed_at;
    h_log("failed %lld ms after the kill: %s", (long long)took, slime_req_error(q));
    H_CHECK_EQ(s, SLIME_ERR_PEER_LOST);
    H_CHECK(took < 5000);
    slime_req_free(q);
    q = NULL;
    H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
    H_CHECK_EQ(slime_req_wait(q, 1000), SLIME_ERR_PEER_LOST);
    slime_req_free(q);
    slime_comm_destroy(comm);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rank 1 enters an allreduce 50 ms before rank 0 does, long enough to
 * give up spinning and nap on the box; rank 0's message must wake it
 * (a futex wake, after the fences of core/wake_fence.c), well before its
 * nap (10 ms) runs out: a missed wake shows as a finish spread over the
 * nap, 4 ms or more after the message in 6 rounds of 10 on average.
 * Only shm has boxes: elsewhere the rounds are receives that sleep in
 * the core, whose wake-ups test_doorbell checks; their times are only
 * logged (over verbs in the emulated soft-RoCE VM they took 2-13 ms). */
static void napping_rank_is_woken(h_rank_t *r)
{
    enum { ROUNDS = 10, SOON_NS = 4000000 };
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 2);
    uint64_t before = box_ops(r);
    int soon = 0;
    for (int i = 0; i < ROUNDS; i++) {
        float x[2] = {(float)r->rank, 1};
        slime_req_t *q = NULL;
        if (r->rank == 0) {
            h_sleep_ms(50);
            uint64_t sent = mono_ns();
            H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
            H_WAIT_FREE(q, SLIME_OK);
            h_ctl_send_u64(r, 1, sent);
        } else {
            H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
            H_WAIT_FREE(q, SLIME_OK);
            uint64_t done = mono_ns(), sent = h_ctl_recv_u64(r, 0);
            h_log("round %d: done %.3f ms after rank 0 came", i, (double)(done - sent) / 1e6);
            soon += done - sent < SOON_NS;
        }
        H_CHECK(x[0] == 1.0f && x[1] == 2.0f);
    }
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? ROUNDS : 0);
    if (r->rank == 1 && over_shm())
        H_CHECK(soon >= 8);
    slime_comm_destroy(comm);
}

/* ---- the other collectives ------------------------------------------ */

/* A broadcast of len bytes from root, checked; 0xee marks unwritten. */
static void broadcast_checked(slime_comm_t *comm, h_rank_t *r, size_t len, int root, int what)
{
    uint8_t *buf = h_alloc(len + 1);
    memset(buf, 0xee, len + 1);
    if (r->rank == root)
        h_fill(buf, len, t_seed(root, what), len);
    T_RUN(slime_broadcast(comm, buf, len, root, &q_));
    H_CHECK_PATTERN(buf, len, t_seed(root, what), len);
    H_CHECK_BYTES(buf + len, 1, 0xee);
    free(buf);
}

/* broadcast (both roots), allgather, reduce_scatter and barrier up to the
 * limit each go through the box over shm (none over tcp); one past the
 * limit does not. */
static void other_collectives_take_the_box(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r), ran = 0;
    const size_t sizes[] = {1, 13, 4096};
    for (size_t s = 0; s < 3; s++) {
        size_t len = sizes[s];
        for (int root = 0; root < 2; root++, ran++)
            broadcast_checked(comm, r, len, root, 1);
        for (int in_place = 0; in_place < 2; in_place++, ran++)
            t_allgather_checked(comm, r->nranks, r->rank, len, in_place, 2 + in_place);
        for (size_t d = 0; d < T_NDTYPES; d++) {
            slime_dtype_t dt = t_dtypes[d];
            size_t count = len / slime_dtype_size(dt);
            for (size_t o = 0; count && o < T_NOPS; o++, ran++) {
                if (!t_applies(t_ops[o], dt)) {
                    ran--;
                    continue;
                }
                t_reduce_scatter_checked(comm, r->nranks, r->rank, dt, t_ops[o], count, o % 2 == 1);
            }
        }
        T_RUN(slime_barrier(comm, &q_));
        ran++;
    }
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? ran : 0);
    before = box_ops(r);
    broadcast_checked(comm, r, 4097, 1, 4);
    t_allgather_checked(comm, r->nranks, r->rank, 4097, false, 5);
    t_reduce_scatter_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 4096 / 4 + 1, false);
    H_CHECK_EQ(box_ops(r) - before, 0);
    slime_comm_destroy(comm);
}

/* Broadcasts of several messages each, the root changing, between
 * exchanges: a root writes ahead of its reader (who now and then comes
 * late) only into a buffer the reader is done with. */
static void broadcast_runs_ahead(h_rank_t *r)
{
    setenv("DLSLIME_PAIR_BOX_MAX", "65536", 1);
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r);
    for (int i = 0; i < 30; i++) {
        int root = i % 3 == 2 ? 1 : 0; /* twice from 0, once from 1 */
        if (r->rank != root && i % 5 == 0)
            h_sleep_ms(2);
        broadcast_checked(comm, r, 20000 + (size_t)i, root, 6 + i % 4);
        if (i % 4 == 3)
            t_allgather_checked(comm, r->nranks, r->rank, 9000 + (size_t)i, false, 10);
    }
    T_RUN(slime_barrier(comm, &q_));
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? 30 + 7 + 1 : 0);
    slime_comm_destroy(comm);
}

/* Hundreds of small broadcasts, a few larger ones among them, the
 * reader now and then late: the root runs ahead through the ring of
 * message heads, laps it many times, and never writes over a head the
 * reader has not read. */
static void small_broadcasts_lap_the_ring(h_rank_t *r)
{
    static const size_t small[] = {8, 64, 112, 4, 48};
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = box_ops(r);
    for (int i = 0; i < 400; i++) {
        if (r->rank == 1 && i % 97 == 0)
            h_sleep_ms(5);
        /* a large one waits for the reader: few, so that the ring laps */
        size_t len = i % 100 == 99 ? 1000 : i % 100 == 98 ? 113 : small[i % 5];
        broadcast_checked(comm, r, len, 0, 100 + i);
    }
    T_RUN(slime_barrier(comm, &q_));
    H_CHECK_EQ(box_ops(r) - before, over_shm() ? 400 + 1 : 0);
    slime_comm_destroy(comm);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"small_ones_take_the_box", small_ones_take_the_box, 2, false, 0},
        {"several_messages", several_messages, 2, false, 0},
        {"more_comms_than_slots", more_comms_than_slots, 2, false, 0},
        {"one_rank_refuses", one_rank_refuses, 2, false, 0},
        {"peer_killed_in_the_box", peer_killed_in_the_box, 2, false, 1u << 1},
        {"napping_rank_is_woken", napping_rank_is_woken, 2, false, 0},
        {"other_collectives_take_the_box", other_collectives_take_the_box, 2, false, 0},
        {"broadcast_runs_ahead", broadcast_runs_ahead, 2, false, 0},
        {"small_broadcasts_lap_the_ring", small_broadcasts_lap_the_ring, 2, false, 0},
    };
    return h_main("test_pair_box", cases, sizeof cases / sizeof cases[0], argc, argv);
}
