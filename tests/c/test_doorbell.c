/*
 * test_doorbell.c - when a peer's message needs a wake-up (a doorbell)
 * and when it does not.  A process whose threads keep posting and testing
 * will look for its messages itself, so its peers skip the doorbell (a
 * syscall each, and a woken progress thread); a process that went quiet
 * still gets one, and what arrives while a peer skips it is still taken
 * by the progress thread's nap.  SLIME_COUNTER_DOORBELLS counts what a
 * context rang (shm; 0 over tcp, whose wake-ups are the socket's own).
 */
#include "harness.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAG_MSG 1
#define TAG_KEEPALIVE 2

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool over_shm(void)
{
    return strcmp(h_transport(), "shm") == 0;
}

static uint64_t doorbells(h_rank_t *r)
{
    return slime_ctx_counter(r->ctx, SLIME_COUNTER_DOORBELLS);
}

/* Work outside the library, as a framework's own code between calls. */
static void busy_us(unsigned us)
{
    uint64_t until = now_ns() + us * 1000ull;
    while (now_ns() < until) {
    }
}

/* Tests req until done (never a wait, so never a spinning waiter). */
static void test_until_done(slime_req_t *req)
{
    uint64_t give_up = now_ns() + (uint64_t)H_WAIT_MS * 1000000ull;
    slime_status_t st;
    while ((st = slime_req_test(req)) == SLIME_INPROGRESS)
        H_CHECK(now_ns() < give_up);
    H_CHECK_OK(st);
}

/* A ping-pong whose ranks only post and test, with 20 us of their own
 * work in between: each finds its message already there or takes it in
 * a test.  Before a test counted as looking, every send rang (the peer's
 * grace came only from spinning waits), so one send that did not ring
 * proves the skip.  How many still ring, rightly, depends on how often
 * the peer was scheduled out for longer than the grace: about 2% on an
 * idle 2-core machine, up to three quarters with another test beside
 * (ctest -j 2 under ASan), so the check asks for the proof, not a rate. */
static void send_tested(h_rank_t *r, uint64_t *word)
{
    slime_req_t *sreq = NULL;
    busy_us(20);
    H_CHECK_OK(slime_send(r->ep[h_peer(r)], word, sizeof *word, TAG_MSG, &sreq));
    test_until_done(sreq);
    slime_req_free(sreq);
}

static void case_tested_peer_gets_no_doorbells(h_rank_t *r)
{
    enum { ROUNDS = 1000 };
    uint64_t word = 0, before = doorbells(r);
    for (int i = 0; i < ROUNDS; i++) {
        slime_req_t *rreq = NULL;
        H_CHECK_OK(slime_recv(r->ep[h_peer(r)], &word, sizeof word, TAG_MSG, &rreq));
        if (r->rank == 0)
            send_tested(r, &word);
        busy_us(20);
        test_until_done(rreq);
        slime_req_free(rreq);
        if (r->rank == 1)
            send_tested(r, &word);
    }
    uint64_t rang = doorbells(r) - before;
    h_log("%llu doorbells for %d messages sent", (unsigned long long)rang, ROUNDS);
    if (over_shm())
        H_CHECK(rang < ROUNDS);
    else
        H_CHECK_EQ(rang, 0);
    h_barrier(r);
}

typedef struct completion {
    _Atomic uint64_t at_ns; /* when the request completed (0: not yet) */
} completion_t;

static void note_completion(slime_req_t *req, void *arg)
{
    (void)req;
    atomic_store(&((completion_t *)arg)->at_ns, now_ns());
}

/* Rank 1 posts a receive and goes quiet (no call into the library) long
 * past the grace; rank 0's message must ring the doorbell, and rank 1's
 * progress thread completes the receive long before rank 1 looks. */
static void case_quiet_peer_is_woken(h_rank_t *r)
{
    const int peer = h_peer(r);
    uint64_t word = 7;
    if (r->rank == 1) {
        completion_t done = {0};
        slime_req_t *rreq = NULL;
        H_CHECK_OK(slime_recv(r->ep[peer], &word, sizeof word, TAG_MSG, &rreq));
        H_CHECK_OK(slime_req_on_complete(rreq, note_completion, &done));
        h_ctl_send_u64(r, 0, 1);
        h_sleep_ms(400);
        uint64_t sent_at = h_ctl_recv_u64(r, 0);
        uint64_t took = atomic_load(&done.at_ns);
        H_CHECK(took != 0);
        h_log("completed %.2f ms after the send, unwaited", (double)(took - sent_at) / 1e6);
        H_CHECK(took - sent_at < 200000000ull);
        H_WAIT_FREE(rreq, SLIME_OK);
        H_CHECK_EQ(word, 8);
    } else {
        (void)h_ctl_recv_u64(r, 1);
        h_sleep_ms(50); /* rank 1's grace is long over */
        uint64_t before = doorbells(r);
        word = 8;
        slime_req_t *sreq = NULL;
        uint64_t sent_at = now_ns();
        H_CHECK_OK(slime_send(r->ep[peer], &word, sizeof word, TAG_MSG, &sreq));
        H_WAIT_FREE(sreq, SLIME_OK);
        if (over_shm())
            H_CHECK(doorbells(r) - before >= 1);
        h_ctl_send_u64(r, 1, sent_at);
    }
    h_barrier(r);
}

/* Rank 1 keeps its grace alive by posting (receives nobody sends) but
 * never tests or waits: the message rank 0 sends meanwhile may ring no
 * doorbell, and rank 1's progress thread, napping through the grace,
 * must still take it within a few naps. */
static void case_nap_covers_the_grace(h_rank_t *r)
{
    enum { KEEPALIVES = 2000 };
    const int peer = h_peer(r);
    uint64_t word = 0;
    if (r->rank == 1) {
        static slime_req_t *keep[KEEPALIVES];
        static uint8_t sink[KEEPALIVES];
        completion_t done = {0};
        slime_req_t *rreq = NULL;
        H_CHECK_OK(slime_recv(r->ep[peer], &word, sizeof word, TAG_MSG, &rreq));
        H_CHECK_OK(slime_req_on_complete(rreq, note_completion, &done));
        h_ctl_send_u64(r, 0, 1);
        for (int i = 0; i < KEEPALIVES; i++) {
            busy_us(20);
            H_CHECK_OK(slime_recv(r->ep[peer], &sink[i], 1, TAG_KEEPALIVE, &keep[i]));
        }
        uint64_t sent_at = h_ctl_recv_u64(r, 0);
        uint64_t took = atomic_load(&done.at_ns);
        H_CHECK(took != 0);
        h_log("completed %.2f ms after the send, unwaited", (double)(took - sent_at) / 1e6);
        H_CHECK(took - sent_at < 100000000ull);
        for (int i = 0; i < KEEPALIVES; i++) {
            H_CHECK_OK(slime_req_cancel(keep[i]));
            H_WAIT_FREE(keep[i], SLIME_ERR_CANCELED);
        }
        H_WAIT_FREE(rreq, SLIME_OK);
        H_CHECK_EQ(word, 9);
    } else {
        (void)h_ctl_recv_u64(r, 1);
        h_sleep_ms(5);
        word = 9;
        slime_req_t *sreq = NULL;
        uint64_t sent_at = now_ns();
        H_CHECK_OK(slime_send(r->ep[peer], &word, sizeof word, TAG_MSG, &sreq));
        H_WAIT_FREE(sreq, SLIME_OK);
        h_ctl_send_u64(r, 1, sent_at);
    }
    h_barrier(r);
}

/* Rank 0's message is eight rings long (main sets the ring's size): it
 * fills the ring and waits for room, long enough for its waits to give
 * up spinning and sleep, while rank 1 has no receive for it (its first
 * piece stays parked in the ring).  Rank 1's receive, posted late, frees
 * the room piece by piece and must ring the sleeping writer for it; the
 * message arrives whole. */
static void case_full_ring_writer_is_woken(h_rank_t *r)
{
    enum { BYTES = 64 << 10 };
    static uint8_t buf[BYTES];
    const int peer = h_peer(r);
    if (r->rank == 0) {
        for (size_t i = 0; i < BYTES; i++)
            buf[i] = (uint8_t)(i * 7 + 1);
        slime_req_t *sreq = NULL;
        H_CHECK_OK(slime_send(r->ep[peer], buf, BYTES, TAG_MSG, &sreq));
        H_WAIT_FREE(sreq, SLIME_OK);
    } else {
        h_sleep_ms(300); /* rank 0's wait stopped spinning long ago */
        uint64_t before = doorbells(r), posted_at = now_ns();
        memset(buf, 0, BYTES);
        slime_req_t *rreq = NULL;
        H_CHECK_OK(slime_recv(r->ep[peer], buf, BYTES, TAG_MSG, &rreq));
        H_WAIT_FREE(rreq, SLIME_OK);
        uint64_t took = now_ns() - posted_at;
        h_log("received %.2f ms after the post, %llu doorbells rung", (double)took / 1e6,
              (unsigned long long)(doorbells(r) - before));
        for (size_t i = 0; i < BYTES; i++)
            H_CHECK_EQ(buf[i], (uint8_t)(i * 7 + 1));
        /* unrung, the writer's progress thread looks once a second */
        if (over_shm()) {
            H_CHECK(doorbells(r) - before >= 1);
            H_CHECK(took < 200000000ull);
        }
    }
    h_barrier(r);
}

int main(int argc, char **argv)
{
    /* before any context exists: the shm rings of every case */
    setenv("DLSLIME_SHM_RING", "8192", 1);
    static const h_case_t cases[] = {
        {"tested_peer_gets_no_doorbells", case_tested_peer_gets_no_doorbells, 2, false, 0},
        {"quiet_peer_is_woken", case_quiet_peer_is_woken, 2, false, 0},
        {"nap_covers_the_grace", case_nap_covers_the_grace, 2, false, 0},
        {"full_ring_writer_is_woken", case_full_ring_writer_is_woken, 2, false, 0},
    };
    return h_main("test_doorbell", cases, sizeof cases / sizeof cases[0], argc, argv);
}
