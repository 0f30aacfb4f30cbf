/*
 * test_coll_fail.c - collectives that cannot succeed: bad arguments are
 * refused at once and post nothing; a collective one rank never joins
 * times out; a rank SIGKILLed in the middle fails the others with
 * SLIME_ERR_PEER_LOST; mismatched sizes fail both sides; destroy fails
 * what is queued, and what a waiting caller runs itself.  After a failure
 * the communicator stays broken (later collectives fail fast) while a new
 * communicator works.  A collective posted for a waiter that then does not
 * wait long enough (slime_comm_next_waited) still runs, and one the
 * waiter does wait for never wakes the worker, whichever entry point
 * posted it.
 *
 * The time bounds are liveness bounds (a failure must not wait for an
 * unrelated timeout), not performance claims.
 */
#include "test_coll_util.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define SLACK_MS 5000

/* A call that must fail at once with want, set a detail text, and hand
 * back no request. */
#define REFUSED(want, call_with_q)                                         \
    do {                                                                   \
        slime_req_t *q_ = NULL;                                            \
        H_CHECK_STATUS(call_with_q, want);                                 \
        H_CHECK(q_ == NULL);                                               \
        H_CHECK(slime_last_error()[0] != '\0');                            \
    } while (0)

static void bad_args(h_rank_t *r)
{
    const int n = r->nranks, me = r->rank;
    slime_comm_t *bad = (slime_comm_t *)0x1;
    slime_ep_t *eps[H_MAX_RANKS];
    memcpy(eps, r->ep, sizeof eps);

    /* communicators */
    H_CHECK_STATUS(slime_comm_create(NULL, 1, 0, me, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK(bad == NULL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 0x10000, 0, me, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0x100, me, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, n, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, -1, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, 0, 0, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, me, n, eps, -1, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, me, n, NULL, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, me, n, eps, 1000, NULL), SLIME_ERR_INVAL);
    int other = (me + 1) % n;
    eps[other] = NULL;
    H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, me, n, eps, 1000, &bad), SLIME_ERR_INVAL);
    H_CHECK(strstr(slime_last_error(), "peers[") != NULL);
    if (n >= 3) { /* two ranks, one endpoint */
        eps[other] = r->ep[(other + 1) % n == me ? (other + 2) % n : (other + 1) % n];
        H_CHECK_STATUS(slime_comm_create(r->ctx, 1, 0, me, n, eps, 1000, &bad), SLIME_ERR_INVAL);
        H_CHECK(strstr(slime_last_error(), "share") != NULL);
    }
    memcpy(eps, r->ep, sizeof eps);
    H_CHECK(bad == NULL);

    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    H_CHECK_STATUS(slime_comm_set_timeout(comm, -5), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_comm_set_timeout(NULL, 5), SLIME_ERR_INVAL);

    /* the op / dtype table */
    H_CHECK_OK(slime_redop_check(SLIME_RED_SUM, SLIME_DT_BFLOAT16));
    H_CHECK_OK(slime_redop_check(SLIME_RED_BXOR, SLIME_DT_BOOL));
    H_CHECK_STATUS(slime_redop_check(SLIME_RED_BXOR, SLIME_DT_FLOAT32), SLIME_ERR_UNSUPPORTED);
    H_CHECK(strstr(slime_last_error(), "bxor") && strstr(slime_last_error(), "float32"));
    H_CHECK_STATUS(slime_redop_check(SLIME_RED_AVG, SLIME_DT_INT32), SLIME_ERR_UNSUPPORTED);
    H_CHECK(strstr(slime_last_error(), "avg") && strstr(slime_last_error(), "int32"));
    H_CHECK_STATUS(slime_redop_check(SLIME_RED_AVG, SLIME_DT_BOOL), SLIME_ERR_UNSUPPORTED);
    H_CHECK_STATUS(slime_redop_check((slime_redop_t)99, SLIME_DT_INT8), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_redop_check(SLIME_RED_SUM, (slime_dtype_t)99), SLIME_ERR_INVAL);
    H_CHECK_EQ(slime_dtype_size((slime_dtype_t)99), 0);
    H_CHECK_EQ(slime_dtype_size(SLIME_DT_BFLOAT16), 2);

    /* collectives */
    uint8_t buf[64], dst[64 * H_MAX_RANKS];
    REFUSED(SLIME_ERR_INVAL, slime_allreduce(NULL, buf, 1, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    H_CHECK_STATUS(slime_allreduce(comm, buf, 1, SLIME_DT_INT8, SLIME_RED_SUM, NULL), SLIME_ERR_INVAL);
    REFUSED(SLIME_ERR_INVAL, slime_allreduce(comm, NULL, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allreduce(comm, buf, 4, (slime_dtype_t)42, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allreduce(comm, buf, 4, SLIME_DT_INT8, (slime_redop_t)42, &q_));
    REFUSED(SLIME_ERR_UNSUPPORTED, slime_allreduce(comm, buf, 4, SLIME_DT_FLOAT64, SLIME_RED_BAND, &q_));
    H_CHECK(strstr(slime_last_error(), "allreduce") && strstr(slime_last_error(), "float64"));
    REFUSED(SLIME_ERR_UNSUPPORTED, slime_allreduce(comm, buf, 4, SLIME_DT_UINT8, SLIME_RED_AVG, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allreduce(comm, buf, SIZE_MAX / 2, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_broadcast(comm, buf, 4, n, &q_));
    H_CHECK(strstr(slime_last_error(), "root") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_broadcast(comm, buf, 4, -1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_broadcast(comm, NULL, 4, 0, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_reduce(comm, buf, 4, SLIME_DT_INT8, SLIME_RED_SUM, n, &q_));
    REFUSED(SLIME_ERR_UNSUPPORTED, slime_reduce(comm, buf, 4, SLIME_DT_BOOL, SLIME_RED_AVG, 0, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_reduce(comm, NULL, 4, SLIME_DT_INT8, SLIME_RED_SUM, 0, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather(comm, NULL, 4, dst, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather(comm, buf, 4, NULL, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather(comm, buf, SIZE_MAX / 2 + 1, dst, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_gather(comm, buf, 4, dst, n, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_gather(comm, NULL, 4, dst, 0, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_gather(comm, buf, 4, NULL, me, &q_)); /* the root needs dst */
    REFUSED(SLIME_ERR_INVAL, slime_scatter(comm, NULL, 4, buf, me, &q_)); /* the root needs src */
    REFUSED(SLIME_ERR_INVAL, slime_scatter(comm, dst, 4, NULL, 0, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_scatter(comm, dst, 4, buf, -2, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_reduce_scatter(comm, NULL, buf, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_reduce_scatter(comm, dst, NULL, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_UNSUPPORTED,
            slime_reduce_scatter(comm, dst, buf, 4, SLIME_DT_BFLOAT16, SLIME_RED_BOR, &q_));
    REFUSED(SLIME_ERR_INVAL,
            slime_reduce_scatter(comm, dst, buf, SIZE_MAX / 4, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
    size_t z[H_MAX_RANKS] = {0}, four[H_MAX_RANKS] = {4, 4, 4, 4}, big[H_MAX_RANKS];
    for (int k = 0; k < H_MAX_RANKS; k++)
        big[k] = SIZE_MAX - 2;
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv(comm, buf, NULL, z, dst, z, z, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv(comm, buf, z, z, dst, NULL, z, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv(comm, NULL, four, z, dst, four, z, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv(comm, buf, four, big, dst, four, z, &q_));
    size_t self_only[H_MAX_RANKS] = {0};
    self_only[me] = 4;
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv(comm, buf, self_only, z, dst, z, z, &q_));
    H_CHECK(strstr(slime_last_error(), "itself") != NULL);
    const void *srcs[H_MAX_RANKS] = {0};
    void *dsts[H_MAX_RANKS] = {0};
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv_ptrs(comm, NULL, z, dsts, z, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv_ptrs(comm, srcs, z, dsts, NULL, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv_ptrs(comm, srcs, four, dsts, z, &q_));
    H_CHECK(strstr(slime_last_error(), "NULL src") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_alltoallv_ptrs(NULL, srcs, z, dsts, z, &q_));
    /* per-block allgather / reduce_scatter: every block must be there */
    void *blocks[H_MAX_RANKS];
    const void *cblocks[H_MAX_RANKS];
    for (int k = 0; k < n; k++) {
        blocks[k] = dst + 4 * k;
        cblocks[k] = dst + 4 * k;
    }
    blocks[n - 1] = NULL;
    cblocks[n - 1] = NULL;
    REFUSED(SLIME_ERR_INVAL, slime_allgather_ptrs(comm, buf, 4, blocks, &q_));
    H_CHECK(strstr(slime_last_error(), "NULL dst block") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_allgather_ptrs(comm, buf, 4, NULL, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather_ptrs(comm, NULL, 4, dsts, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather_ptrs(comm, buf, SIZE_MAX / 2 + 1, blocks, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_allgather_ptrs(NULL, buf, 4, blocks, &q_));
    REFUSED(SLIME_ERR_INVAL,
            slime_reduce_scatter_ptrs(comm, cblocks, buf, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    H_CHECK(strstr(slime_last_error(), "NULL src block") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_reduce_scatter_ptrs(comm, NULL, buf, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    cblocks[n - 1] = dst;
    REFUSED(SLIME_ERR_INVAL,
            slime_reduce_scatter_ptrs(comm, cblocks, NULL, 4, SLIME_DT_INT8, SLIME_RED_SUM, &q_));
    REFUSED(SLIME_ERR_UNSUPPORTED,
            slime_reduce_scatter_ptrs(comm, cblocks, buf, 4, SLIME_DT_FLOAT32, SLIME_RED_BXOR, &q_));
    /* per-block gather / scatter: the root's blocks must be there */
    REFUSED(SLIME_ERR_INVAL, slime_gather_ptrs(comm, buf, 4, blocks, me, &q_));
    H_CHECK(strstr(slime_last_error(), "NULL dst block for rank") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_gather_ptrs(comm, buf, 4, NULL, me, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_gather_ptrs(comm, NULL, 4, dsts, me, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_gather_ptrs(comm, buf, 4, dsts, n, &q_));
    cblocks[n - 1] = NULL;
    REFUSED(SLIME_ERR_INVAL, slime_scatter_ptrs(comm, cblocks, 4, buf, me, &q_));
    H_CHECK(strstr(slime_last_error(), "NULL src block for rank") != NULL);
    REFUSED(SLIME_ERR_INVAL, slime_scatter_ptrs(comm, NULL, 4, buf, me, &q_));
    cblocks[n - 1] = dst;
    REFUSED(SLIME_ERR_INVAL, slime_scatter_ptrs(comm, cblocks, 4, NULL, me, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_scatter_ptrs(comm, cblocks, SIZE_MAX / 2 + 1, buf, me, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_barrier(NULL, &q_));
    H_CHECK_STATUS(slime_barrier(comm, NULL), SLIME_ERR_INVAL);

    /* point-to-point */
    REFUSED(SLIME_ERR_INVAL, slime_comm_send(comm, n, buf, 4, 1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_send(comm, me, buf, 4, 1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_send(comm, SLIME_ANY_SOURCE, buf, 4, 1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_send(comm, other, buf, 4, 1ull << 39, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_send(comm, other, NULL, 4, 1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_recv(comm, -7, buf, 4, 1, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_recv(comm, SLIME_ANY_SOURCE, buf, 4, ~0ull, &q_));
    REFUSED(SLIME_ERR_INVAL, slime_comm_recv(NULL, other, buf, 4, 1, &q_));
    H_CHECK_EQ(slime_comm_req_source(comm, NULL), (uint64_t)-1);
    H_CHECK_EQ(slime_comm_rank(NULL), (uint64_t)-1);

    /* nothing was posted: the communicator is in step on every rank */
    int32_t x = me + 1;
    T_RUN(slime_allreduce(comm, &x, 1, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
    H_CHECK_EQ(x, n * (n + 1) / 2);
    slime_comm_destroy(comm);
    slime_comm_destroy(NULL);

    /* an endpoint of another context */
    slime_ctx_t *ctx2 = h_ctx_create(NULL);
    slime_comm_t *c2 = NULL;
    H_CHECK_STATUS(slime_comm_create(ctx2, 1, 0, me, n, r->ep, 1000, &c2), SLIME_ERR_INVAL);
    H_CHECK(strstr(slime_last_error(), "another context") != NULL);
    /* a communicator of one needs no endpoints */
    H_CHECK_OK(slime_comm_create(ctx2, 1, 0, 0, 1, NULL, 1000, &c2));
    int64_t v = 5;
    T_RUN(slime_allreduce(c2, &v, 1, SLIME_DT_INT64, SLIME_RED_PROD, &q_));
    H_CHECK_EQ(v, 5);
    slime_comm_destroy(c2);
    slime_ctx_destroy(ctx2);
}

/* Waits for req's final status for at most max_ms; fails the case if it
 * is still pending then. */
static slime_status_t final_within(slime_req_t *req, int64_t max_ms, char *detail, size_t len)
{
    slime_status_t s = slime_req_wait(req, max_ms);
    if (s == SLIME_ERR_TIMEOUT && slime_req_test(req) == SLIME_INPROGRESS)
        h_fail(__FILE__, __LINE__, "collective still pending after %lld ms", (long long)max_ms);
    snprintf(detail, len, "%s", slime_req_error(req));
    slime_req_free(req);
    return s;
}

/* Rank 2 never joins the allreduce: ranks 0 and 1 fail with TIMEOUT at
 * their 1 s timeout; rank 2, with a 30 s timeout, joins late and then
 * finishes fast (failed by the others' abort notice, or completed from
 * what they sent before giving up); a fresh communicator works. */
static void timeout(h_rank_t *r)
{
    enum { LATE = 2, TIMEOUT_MS = 1000 };
    const int me = r->rank;
    slime_comm_t *comm = t_comm(r, T_COMM_ID, me == LATE ? H_WAIT_MS : TIMEOUT_MS);
    char detail[1024];
    int32_t x[100];
    for (int i = 0; i < 100; i++)
        x[i] = me;
    T_RUN(slime_barrier(comm, &q_)); /* it works until then */
    if (me != LATE) {
        slime_req_t *q = NULL;
        int64_t t0 = h_now_ms();
        H_CHECK_OK(slime_allreduce(comm, x, 100, SLIME_DT_INT32, SLIME_RED_SUM, &q));
        slime_status_t s = final_within(q, TIMEOUT_MS + SLACK_MS, detail, sizeof detail);
        int64_t took = h_now_ms() - t0;
        h_log("allreduce failed after %lld ms: %s", (long long)took, detail);
        H_CHECK_EQ(s, SLIME_ERR_TIMEOUT);
        H_CHECK(strstr(detail, "allreduce") != NULL);
        H_CHECK(strstr(detail, "rank") != NULL);
        /* broken: the next one fails at once, with the same cause */
        H_CHECK_OK(slime_barrier(comm, &q));
        H_CHECK_EQ(final_within(q, 1000, detail, sizeof detail), SLIME_ERR_TIMEOUT);
        H_CHECK(strstr(detail, "broken") != NULL);
        if (me == 1) {
            h_ctl_send_u64(r, 0, 1);
        } else {
            (void)h_ctl_recv_u64(r, 1);
            h_ctl_send_u64(r, LATE, 1);
        }
    } else {
        H_CHECK_EQ(h_ctl_recv_u64(r, 0), 1);
        slime_req_t *q = NULL;
        H_CHECK_OK(slime_allreduce(comm, x, 100, SLIME_DT_INT32, SLIME_RED_SUM, &q));
        /* it must not wait out its own 30 s timeout: either the others'
         * abort notice fails it, or (a race) the contributions they sent
         * before giving up were all here already and it completes */
        slime_status_t s = final_within(q, SLACK_MS, detail, sizeof detail);
        h_log("late allreduce: %s %s", slime_status_name(s), detail);
        if (s != SLIME_OK) {
            H_CHECK_EQ(s, SLIME_ERR_TIMEOUT);
            H_CHECK(strstr(detail, "aborted") != NULL);
        }
    }
    slime_comm_destroy(comm);

    h_barrier(r);
    slime_comm_t *fresh = t_comm(r, T_COMM_ID + 1, H_WAIT_MS);
    for (int i = 0; i < 100; i++)
        x[i] = me;
    T_RUN(slime_allreduce(fresh, x, 100, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
    for (int i = 0; i < 100; i++)
        H_CHECK_EQ(x[i], 0 + 1 + 2);
    slime_comm_destroy(fresh);
}

/* Rank 1 is SIGKILLed while everyone runs collectives back to back:
 * every survivor's collective fails with PEER_LOST within seconds (the
 * communicator's 30 s timeout plays no part), then fails fast. */
static void peer_killed(h_rank_t *r)
{
    enum { VICTIM = 1, KILL_AT = 8, COUNT = 100000 };
    const int me = r->rank;
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    float *buf = h_alloc(COUNT * sizeof *buf);
    char detail[1024];
    int64_t failed_at = 0, killed_at = 0;
    slime_status_t s = SLIME_OK;
    for (int i = 0; i < 100000; i++) {
        slime_req_t *q = NULL;
        if (i % 2)
            H_CHECK_OK(slime_allreduce(comm, buf, COUNT, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
        else
            H_CHECK_OK(slime_broadcast(comm, buf, COUNT * sizeof *buf, i % r->nranks, &q));
        if (me == 0 && i == KILL_AT) {
            h_sleep_ms(2);
            h_kill_rank(r, VICTIM);
            killed_at = h_now_ms();
            for (int k = 2; k < r->nranks; k++)
                h_ctl_send_u64(r, k, (uint64_t)killed_at);
        }
        s = final_within(q, H_WAIT_MS, detail, sizeof detail);
        if (s != SLIME_OK) {
            failed_at = h_now_ms();
            break;
        }
        if (me == VICTIM && i >= KILL_AT) /* from here on, waits to be killed */
            for (;;)
                h_sleep_ms(1000);
    }
    H_CHECK(me != VICTIM);
    if (me != 0)
        killed_at = (int64_t)h_ctl_recv_u64(r, 0);
    h_log("failed %lld ms after the kill: %s", (long long)(failed_at - killed_at), detail);
    H_CHECK_EQ(s, SLIME_ERR_PEER_LOST);
    if (failed_at - killed_at > SLACK_MS)
        h_fail(__FILE__, __LINE__, "failed %lld ms after the kill", (long long)(failed_at - killed_at));
    slime_req_t *q = NULL;
    H_CHECK_OK(slime_allreduce(comm, buf, 10, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
    H_CHECK_EQ(final_within(q, 1000, detail, sizeof detail), SLIME_ERR_PEER_LOST);
    slime_comm_destroy(comm);
    free(buf);
}

/* The same while chunks move by one-sided reads on shm links (a reader
 * of the dead rank's memory, and the dead rank's reader). */
static void peer_killed_reads(h_rank_t *r)
{
    setenv("DLSLIME_COLL_CHUNK", "16384", 1);
    setenv("DLSLIME_COLL_CMA_MIN", "65536", 1);
    setenv("DLSLIME_COLL_CMA_COPY_MIN", "65536", 1);
    peer_killed(r);
}

/* The ranks disagree on the size: both sides fail (a receiver sees the
 * wrong length), neither waits for its timeout. */
static void size_mismatch(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    char detail[1024];
    const size_t counts[] = {10, 200000};
    for (int k = 0; k < 2; k++) {
        size_t count = counts[k] * (size_t)(r->rank + 1);
        float *buf = h_alloc(count * sizeof *buf);
        slime_req_t *q = NULL;
        H_CHECK_OK(slime_allreduce(comm, buf, count, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q));
        slime_status_t s = final_within(q, SLACK_MS, detail, sizeof detail);
        h_log("mismatch: %s: %s", slime_status_name(s), detail);
        if (k == 0)
            H_CHECK_ONE_OF(s, SLIME_ERR_INVAL, SLIME_ERR_TRUNCATED);
        else /* broken by the first */
            H_CHECK(s != SLIME_OK && strstr(detail, "broken") != NULL);
        free(buf);
    }
    slime_comm_destroy(comm);
}

/* Destroy with collectives queued and one running (the peer never joins):
 * all of them fail with CLOSED, promptly. */
static void destroy_queued(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    enum { N = 5 };
    int32_t x[N];
    if (r->rank == 0) {
        slime_req_t *q[N];
        for (int i = 0; i < N; i++)
            H_CHECK_OK(slime_allreduce(comm, &x[i], 1, SLIME_DT_INT32, SLIME_RED_SUM, &q[i]));
        h_sleep_ms(50);
        H_CHECK_EQ(slime_req_test(q[0]), SLIME_INPROGRESS);
        int64_t t0 = h_now_ms();
        slime_comm_destroy(comm);
        for (int i = 0; i < N; i++) {
            H_WAIT(q[i], SLIME_ERR_CLOSED);
            slime_req_free(q[i]);
        }
        int64_t took = h_now_ms() - t0;
        if (took > SLACK_MS)
            h_fail(__FILE__, __LINE__, "destroy took %lld ms", (long long)took);
    } else {
        slime_comm_destroy(comm);
    }
}

/* A waiter whose wait outlasts the communicator's timeout runs the
 * collective itself when nobody has started it (the worker may still win
 * the race): results are right either way, back to back. */
static void waiter_runs(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, 5000);
    const int n = r->nranks;
    for (int i = 0; i < 200; i++) {
        int64_t x[3] = {r->rank, i, 1};
        slime_req_t *q = NULL;
        H_CHECK_OK(slime_allreduce(comm, x, 3, SLIME_DT_INT64, SLIME_RED_SUM, &q));
        H_CHECK_OK(slime_req_wait(q, H_WAIT_MS));
        slime_req_free(q);
        H_CHECK(x[0] == (int64_t)n * (n - 1) / 2 && x[1] == (int64_t)i * n && x[2] == n);
    }
    slime_comm_destroy(comm);
}

typedef struct destroyer_arg {
    slime_comm_t *comm;
    int64_t took_ms;
} destroyer_arg_t;

static void *destroyer(void *p)
{
    destroyer_arg_t *a = p;
    h_sleep_ms(200);
    int64_t t0 = h_now_ms();
    slime_comm_destroy(a->comm);
    a->took_ms = h_now_ms() - t0;
    return NULL;
}

/* Destroy from another thread while the caller waits on a collective the
 * peer never joins; posted then waited at once on a fresh communicator
 * (whose worker thread is only starting), the caller is the one running
 * it.  The wait ends with CLOSED promptly, and destroy waits for the
 * caller to leave the communicator. */
static void destroy_waiter_running(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, 10000);
    if (r->rank == 0) {
        destroyer_arg_t a = {comm, 0};
        pthread_t th;
        H_CHECK(pthread_create(&th, NULL, destroyer, &a) == 0);
        int32_t x = 1;
        slime_req_t *q = NULL;
        int64_t t0 = h_now_ms();
        H_CHECK_OK(slime_allreduce(comm, &x, 1, SLIME_DT_INT32, SLIME_RED_SUM, &q));
        slime_status_t st = slime_req_wait(q, H_WAIT_MS);
        int64_t took = h_now_ms() - t0;
        pthread_join(th, NULL);
        h_log("waiter: %s after %lld ms; destroy took %lld ms", slime_status_name(st), (long long)took,
              (long long)a.took_ms);
        H_CHECK_EQ(st, SLIME_ERR_CLOSED);
        H_CHECK(a.took_ms < SLACK_MS && took < 200 + SLACK_MS);
        slime_req_free(q);
    }
    h_barrier(r);
    if (r->rank != 0) slime_comm_destroy(comm);
}

static void note_done(slime_req_t *req, void *arg)
{
    (void)req;
    atomic_store((_Atomic bool *)arg, true);
}

/* Rank 0 polls req (slime_req_test runs no collective) until it is done. */
static void poll_done(slime_req_t *q, _Atomic bool *flag)
{
    int64_t t0 = h_now_ms();
    while (flag ? !atomic_load(flag) : slime_req_test(q) == SLIME_INPROGRESS) {
        if (h_now_ms() - t0 > H_WAIT_MS) h_fail(__FILE__, __LINE__, "the collective never ran");
        h_sleep_ms(1);
    }
}

/* After slime_comm_next_waited the post does not wake the worker: what
 * follows it, if not a wait long enough to run the collective, must hand
 * it over.  Each round rank 0 follows it otherwise (a wait, freeing the
 * request unwaited, a completion callback, a wait shorter than the
 * communicator's timeout, and a hint spent on a refused call before a
 * post it only polls) while the others wait; nobody posts again before
 * the round's barrier, so a collective left unstarted fails the round. */
static void next_waited(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, 5000);
    const int n = r->nranks;
    int64_t x[5]; /* rank 0 checks a freed round's sum after the last */
    for (int round = 0; round < 5; round++) {
        x[round] = r->rank + 1;
        slime_req_t *q = NULL;
        _Atomic bool called = false;
        if (r->rank == 0) slime_comm_next_waited(comm);
        if (r->rank == 0 && round == 4)
            REFUSED(SLIME_ERR_INVAL, slime_allreduce(comm, NULL, 1, SLIME_DT_INT64, SLIME_RED_SUM, &q_));
        H_CHECK_OK(slime_allreduce(comm, &x[round], 1, SLIME_DT_INT64, SLIME_RED_SUM, &q));
        if (r->rank != 0 || round == 0)
            H_CHECK_OK(slime_req_wait(q, H_WAIT_MS));
        else if (round == 1)
            slime_req_free(q);
        else if (round == 2)
            H_CHECK_OK(slime_req_on_complete(q, note_done, &called));
        else if (round == 3)
            H_CHECK_OK(slime_req_wait(q, 2000));
        if (r->rank == 0 && (round == 2 || round == 4)) poll_done(q, round == 2 ? &called : NULL);
        if (round != 1 || r->rank != 0) {
            H_CHECK_STATUS(slime_req_test(q), SLIME_OK);
            H_CHECK(x[round] == (int64_t)n * (n + 1) / 2);
            slime_req_free(q);
        }
        h_barrier(r);
    }
    H_CHECK(x[1] == (int64_t)n * (n + 1) / 2);
    slime_comm_destroy(comm);
}

/* The thread ids of this process's communicator worker threads (named
 * slime-coll), at most max; how many. */
static int worker_tids(pid_t *tids, int max)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    H_CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char path[300], line[128];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        bool worker = f && fgets(line, sizeof line, f) && strncmp(line, "slime-coll", 10) == 0;
        if (f)
            fclose(f);
        if (worker)
            tids[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

/* Context switches of this process's communicator worker threads: how
 * often they were woken. */
static uint64_t worker_switches(void)
{
    uint64_t total = 0;
    pid_t tids[16];
    int n = worker_tids(tids, 16);
    for (int i = 0; i < n; i++) {
        char path[64], line[128];
        snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long long v;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
                total += v;
        fclose(f);
    }
    return total;
}

/* The worker runs as a batch thread: woken by a post, it does not
 * preempt the poster, which mostly runs the collective itself. */
static void worker_is_batch(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    T_RUN(slime_barrier(comm, &q_)); /* the worker starts at the first post */
    pid_t tids[16];
    int n = 0;
    for (int tries = 0; tries < 200 && n == 0; tries++) { /* it names itself once running */
        if (tries) h_sleep_ms(10);
        n = worker_tids(tids, 16);
    }
    H_CHECK_EQ(n, 1);
    H_CHECK_EQ(sched_getscheduler(tids[0]), SCHED_BATCH);
    slime_comm_destroy(comm);
}

/* The flat forms (allgather, reduce_scatter, alltoallv) keep the
 * promise of slime_comm_next_waited as the others do: their posts do not
 * wake the worker, whose thread then never runs (each once woke it, and
 * the worker, woken on two cores, took one from the ranks). */
static void next_waited_flat_forms(h_rank_t *r)
{
    enum { ROUNDS = 100 };
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const int n = r->nranks;
    int32_t x = 1, all[H_MAX_RANKS], src[H_MAX_RANKS], got[H_MAX_RANKS], one = 0;
    size_t bytes[H_MAX_RANKS], offs[H_MAX_RANKS];
    for (int q = 0; q < n; q++) {
        bytes[q] = sizeof(int32_t);
        offs[q] = (size_t)q * sizeof(int32_t);
        src[q] = r->rank * 10 + q;
    }
    T_RUN(slime_barrier(comm, &q_)); /* the worker starts at the first post */
    h_sleep_ms(50);
    uint64_t before = worker_switches();
    for (int i = 0; i < ROUNDS; i++) {
        slime_comm_next_waited(comm);
        T_RUN(slime_allgather(comm, &x, sizeof x, all, &q_));
        slime_comm_next_waited(comm);
        T_RUN(slime_reduce_scatter(comm, src, &one, 1, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
        slime_comm_next_waited(comm);
        T_RUN(slime_alltoallv(comm, src, bytes, offs, got, bytes, offs, &q_));
    }
    uint64_t woken = worker_switches() - before;
    h_log("the worker switched %llu times in %d collectives", (unsigned long long)woken, 3 * ROUNDS);
    H_CHECK(woken < ROUNDS / 4);
    int32_t sum = 0;
    for (int q = 0; q < n; q++) {
        H_CHECK_EQ(all[q], 1);
        H_CHECK_EQ(got[q], q * 10 + r->rank);
        sum += q * 10 + r->rank;
    }
    H_CHECK_EQ(one, sum);
    slime_comm_destroy(comm);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"bad_args_2", bad_args, 2, false, 0},
        {"bad_args_3", bad_args, 3, false, 0},
        {"timeout", timeout, 3, false, 0},
        {"peer_killed", peer_killed, 4, false, 1u << 1},
        {"peer_killed_3", peer_killed, 3, false, 1u << 1},
        {"peer_killed_reads", peer_killed_reads, 4, false, 1u << 1},
        {"size_mismatch", size_mismatch, 2, false, 0},
        {"destroy_queued", destroy_queued, 2, false, 0},
        {"waiter_runs", waiter_runs, 3, false, 0},
        {"destroy_waiter_running", destroy_waiter_running, 2, false, 0},
        {"next_waited", next_waited, 3, false, 0},
        {"next_waited_flat_forms", next_waited_flat_forms, 3, false, 0},
        {"worker_is_batch", worker_is_batch, 2, false, 0},
    };
    return h_main("test_coll_fail", cases, sizeof cases / sizeof cases[0], argc, argv);
}
