/*
 * test_faults.c - peer liveness: rank 1 is stopped (SIGSTOP), which keeps
 * its connections open, so nothing sees it go.  What rank 0 waits on from
 * it fails with SLIME_ERR_PEER_LOST, saying the peer stopped answering,
 * after the silence limit (DLSLIME_PEER_SILENCE_MS, silence_ms() here) and
 * long before any timeout; a one-sided op that needs no CPU of the peer's
 * (shm by CMA, verbs RDMA) still completes against the stopped process;
 * a rank whose threads are all busy elsewhere is answered for by its
 * progress thread and not declared dead.
 *
 * The bound is a liveness bound (nothing may wait for its timeout), not a
 * performance claim: the measured times are about silence_ms().
 */
#include "harness.h"

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* DLSLIME_TEST_SILENCE_MS: a longer limit where the CPU is emulated (the
 * soft-RoCE VM), so a busy peer's answer is not late by emulation alone */
static int silence_ms(void)
{
    const char *env = getenv("DLSLIME_TEST_SILENCE_MS");
    return env && atoi(env) > 0 ? atoi(env) : 500;
}
#define LOST_BOUND_MS 10000 /* far below H_WAIT_MS */
#define BIG (64u << 20)
#define UNEXPECTED_MAX "1M" /* what a rank keeps of messages not asked for yet */

enum { VICTIM = 1 };

static _Noreturn void linger(void)
{
    for (;;)
        pause();
}

/* Whether every thread of pid is stopped (state T in /proc). */
static bool all_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    H_CHECK(d != NULL);
    bool stopped = true;
    struct dirent *e;
    while (stopped && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char stat[96], buf[512];
        snprintf(stat, sizeof stat, "/proc/%d/task/%.32s/stat", (int)pid, e->d_name);
        FILE *f = fopen(stat, "r");
        if (!f)
            continue; /* the thread ended */
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *state = strrchr(buf, ')'); /* after the command name */
        stopped = state && state[1] == ' ' && state[2] == 'T';
    }
    closedir(d);
    return stopped;
}

/* SIGSTOP is delivered asynchronously: returns once it has taken hold. */
static void stop_victim(h_rank_t *r)
{
    H_CHECK(kill(r->pid[VICTIM], SIGSTOP) == 0);
    const int64_t start = h_now_ms();
    while (!all_stopped(r->pid[VICTIM])) {
        if (h_now_ms() - start > LOST_BOUND_MS)
            h_fail(__FILE__, __LINE__, "rank %d did not stop", VICTIM);
        h_sleep_ms(1);
    }
    h_log("stopped rank %d", VICTIM);
}

/* req fails with PEER_LOST, for the peer's silence, within the bound. */
static void expect_silence(slime_req_t *req, int64_t since, const char *what)
{
    slime_status_t s = slime_req_wait(req, LOST_BOUND_MS);
    int64_t took = h_now_ms() - since;
    if (s != SLIME_ERR_PEER_LOST)
        h_fail(__FILE__, __LINE__, "%s with rank 1 stopped -> %s after %lld ms, want SLIME_ERR_PEER_LOST",
               what, slime_status_name(s), (long long)took);
    const char *why = slime_req_error(req);
    if (!why || !strstr(why, "stopped answering"))
        h_fail(__FILE__, __LINE__, "%s: error does not say the peer stopped answering: %s", what,
               why ? why : "(none)");
    h_log("%s failed %lld ms after the stop: %s", what, (long long)took, why);
    slime_req_free(req);
}

/* Rank 0 sends large messages that rank 1 has begun to receive, and
 * stops rank 1 while they are under way.  The first may complete (a
 * transport may write it into the stopped process by itself); the second
 * needs rank 1 to take it. */
static void case_stopped_receiver(h_rank_t *r)
{
    uint8_t *buf = h_alloc(BIG);
    slime_req_t *first = NULL, *second = NULL;
    if (r->rank == VICTIM) {
        H_CHECK_OK(slime_recv(r->ep[0], buf, BIG, 1, &first));
        h_ctl_send_u64(r, 0, 1);
        linger();
    }
    (void)h_ctl_recv_u64(r, VICTIM);
    H_CHECK_OK(slime_send(r->ep[VICTIM], buf, BIG, 1, &first));
    H_CHECK_OK(slime_send(r->ep[VICTIM], buf, BIG, 1, &second));
    h_sleep_ms(2);
    int64_t stopped_at = h_now_ms();
    stop_victim(r);
    slime_status_t s = slime_req_wait(first, LOST_BOUND_MS);
    H_CHECK(s == SLIME_OK || s == SLIME_ERR_PEER_LOST);
    slime_req_free(first);
    expect_silence(second, stopped_at, "the second send");
    H_CHECK_EQ(slime_ep_status(r->ep[VICTIM]), SLIME_ERR_PEER_LOST);
    h_kill_rank(r, VICTIM);
    free(buf);
}

/* Rank 0 waits for a message that stopped rank 1 was to send. */
static void case_stopped_sender(h_rank_t *r)
{
    if (r->rank == VICTIM) {
        h_ctl_send_u64(r, 0, 1);
        linger();
    }
    (void)h_ctl_recv_u64(r, VICTIM);
    uint8_t small[64];
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(r->ep[VICTIM], small, sizeof small, 2, &req));
    int64_t stopped_at = h_now_ms();
    stop_victim(r);
    expect_silence(req, stopped_at, "the receive");
    h_kill_rank(r, VICTIM);
}

/* A small allreduce of two ranks on one host waits on the shared box,
 * where the core sees no request of it: the stopped peer is found all
 * the same (p2p_ep_wait_begin), for its silence, not the timeout. */
static void case_stopped_in_box(h_rank_t *r)
{
    slime_comm_t *comm = NULL;
    H_CHECK_OK(slime_comm_create(r->ctx, 9, 1, r->rank, 2, r->ep, H_WAIT_MS, &comm));
    float x[2] = {1, 2};
    slime_req_t *req = NULL;
    uint64_t boxed = slime_ctx_counter(r->ctx, SLIME_COUNTER_BOX_OPS);
    H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &req));
    H_WAIT_FREE(req, SLIME_OK);
    if (strcmp(h_transport(), "shm") == 0) /* the path this case is about */
        H_CHECK_EQ(slime_ctx_counter(r->ctx, SLIME_COUNTER_BOX_OPS), boxed + 1);
    if (r->rank == VICTIM) {
        h_ctl_send_u64(r, 0, 1);
        linger();
    }
    (void)h_ctl_recv_u64(r, VICTIM);
    H_CHECK_OK(slime_allreduce(comm, x, 2, SLIME_DT_FLOAT32, SLIME_RED_SUM, &req));
    int64_t stopped_at = h_now_ms();
    stop_victim(r);
    expect_silence(req, stopped_at, "the allreduce");
    h_kill_rank(r, VICTIM);
    slime_comm_destroy(comm);
}

/* One-sided reads of a stopped process: a transport that copies them
 * itself (shm by CMA, verbs by RDMA) completes them, since nothing waits
 * on the peer's CPU; over tcp the peer's engine serves them, so they fail
 * for its silence. */
/* The victim offers buf (filled from seed) and lingers; rank 0 gets its
 * descriptor and registers its own buf for the reads. */
static slime_mr_t *victim_region(h_rank_t *r, uint8_t *buf, size_t len, uint64_t seed, slime_mr_desc_t *remote)
{
    if (r->rank == VICTIM) {
        h_fill(buf, len, seed, 0);
        h_send_desc(r, 0, h_mr_reg(r->ctx, buf, len, SLIME_ACCESS_ALL));
        linger();
    }
    *remote = h_recv_desc(r, VICTIM);
    return h_mr_reg(r->ctx, buf, len, SLIME_ACCESS_ALL);
}

static void case_onesided_into_stopped(h_rank_t *r)
{
    const size_t len = 4u << 20;
    uint8_t *buf = h_alloc(len);
    slime_mr_desc_t remote;
    slime_mr_t *mr = victim_region(r, buf, len, 91, &remote);
    slime_req_t *req = NULL;
    /* a first read while the victim runs: verbs asks a region's owner for
     * its key once (verbs_rkeys.c), and only later reads are the device's
     * alone */
    H_CHECK_OK(slime_read(r->ep[VICTIM], mr, 0, &remote, 0, len, &req));
    H_WAIT_FREE(req, SLIME_OK);
    memset(buf, 0, len);
    int64_t stopped_at = h_now_ms();
    stop_victim(r);
    H_CHECK_OK(slime_read(r->ep[VICTIM], mr, 0, &remote, 0, len, &req));
    if (strcmp(h_transport(), "tcp") == 0) {
        expect_silence(req, stopped_at, "the read");
    } else {
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_PATTERN(buf, len, 91, 0);
        /* nothing waited on the stopped peer: no ping, no failure */
        H_CHECK_EQ(slime_ep_status(r->ep[VICTIM]), SLIME_OK);
    }
    h_kill_rank(r, VICTIM);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

/* A first one-sided read of a stopped process's region: verbs must ask
 * the owner's engine for the region's key (verbs_rkeys.c), tcp's engine
 * serves the read, so both fail for its silence; shm copies it by itself. */
static void case_first_onesided_into_stopped(h_rank_t *r)
{
    const size_t len = 64u << 10;
    uint8_t *buf = h_alloc(len);
    slime_mr_desc_t remote;
    slime_mr_t *mr = victim_region(r, buf, len, 92, &remote);
    slime_req_t *req = NULL;
    int64_t stopped_at = h_now_ms();
    stop_victim(r);
    H_CHECK_OK(slime_read(r->ep[VICTIM], mr, 0, &remote, 0, len, &req));
    if (strcmp(slime_ep_transport(r->ep[VICTIM]), "shm") == 0) {
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_PATTERN(buf, len, 92, 0);
    } else {
        expect_silence(req, stopped_at, "the first read");
    }
    h_kill_rank(r, VICTIM);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

/* Rank 1's only thread of its own sleeps for three silence limits before
 * it sends: its progress thread answers rank 0's pings, so the receive
 * waits it out and completes. */
static void case_busy_peer(h_rank_t *r)
{
    uint8_t msg[256];
    slime_req_t *req = NULL;
    if (r->rank == VICTIM) {
        h_sleep_ms(3 * silence_ms());
        h_fill(msg, sizeof msg, 17, 0);
        H_CHECK_OK(slime_send(r->ep[0], msg, sizeof msg, 3, &req));
        H_WAIT_FREE(req, SLIME_OK);
        h_barrier(r);
        return;
    }
    H_CHECK_OK(slime_recv(r->ep[VICTIM], msg, sizeof msg, 3, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(msg, sizeof msg, 17, 0);
    /* it was silent long enough to be pinged, and it answered */
    uint64_t pings = slime_ctx_counter(r->ctx, SLIME_COUNTER_PEER_PINGS);
    h_log("%llu pings answered", (unsigned long long)pings);
    H_CHECK(pings >= 2);
    h_barrier(r);
}

/* Rank 0 floods rank 1 with small messages nobody has asked for yet,
 * well past what rank 1 keeps unexpected (UNEXPECTED_MAX): rank 1 stops
 * reading rank 0, whose sends wait and whose pings go unread; rank 1 says
 * it is there unasked, so rank 0 waits out its three silence limits
 * asleep, and every message arrives once rank 1 asks for them. */
static void case_held_back(h_rank_t *r)
{
    enum { N = 1024, LEN = 32 * 1024 };
    uint8_t *buf = h_alloc((size_t)N * LEN);
    slime_req_t **reqs = calloc(N, sizeof *reqs);
    H_CHECK(reqs != NULL);
    if (r->rank == VICTIM) {
        h_sleep_ms(3 * silence_ms());
        for (int i = 0; i < N; i++)
            H_CHECK_OK(slime_recv(r->ep[0], buf + (size_t)i * LEN, LEN, 5, &reqs[i]));
    } else {
        h_fill(buf, (size_t)N * LEN, 23, 0);
        for (int i = 0; i < N; i++)
            H_CHECK_OK(slime_send(r->ep[VICTIM], buf + (size_t)i * LEN, LEN, 5, &reqs[i]));
    }
    for (int i = 0; i < N; i++)
        H_WAIT_FREE(reqs[i], SLIME_OK);
    if (r->rank == VICTIM)
        H_CHECK_PATTERN(buf, (size_t)N * LEN, 23, 0);
    h_barrier(r);
    free(reqs);
    free(buf);
}

int main(int argc, char **argv)
{
    char silence[16];
    snprintf(silence, sizeof silence, "%d", silence_ms());
    setenv("DLSLIME_PEER_SILENCE_MS", silence, 1);
    setenv("DLSLIME_UNEXPECTED_MAX", UNEXPECTED_MAX, 1);
    static const h_case_t cases[] = {
        {"stopped_receiver", case_stopped_receiver, 2, false, 1u << VICTIM},
        {"stopped_sender", case_stopped_sender, 2, false, 1u << VICTIM},
        {"onesided_into_stopped", case_onesided_into_stopped, 2, false, 1u << VICTIM},
        {"first_onesided_into_stopped", case_first_onesided_into_stopped, 2, false, 1u << VICTIM},
        {"stopped_in_box", case_stopped_in_box, 2, false, 1u << VICTIM},
        {"busy_peer", case_busy_peer, 2, false, 0},
        {"held_back", case_held_back, 2, false, 0},
    };
    return h_main("test_faults", cases, sizeof cases / sizeof cases[0], argc, argv);
}
