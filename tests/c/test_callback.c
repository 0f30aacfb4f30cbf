/*
 * test_callback.c - slime_req_on_complete: a callback runs exactly once,
 * in the progress thread for a request that completes later (so nobody
 * has to wait on it), at once for one that has completed, on failures
 * too, and a request freed before its callback ran is freed after it.
 */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct seen {
    atomic_int calls;
    atomic_int status;
    pthread_t thread;
} seen_t;

static void record(slime_req_t *req, void *arg)
{
    seen_t *s = arg;
    s->thread = pthread_self();
    atomic_store(&s->status, (int)slime_req_test(req));
    atomic_fetch_add(&s->calls, 1);
}

static void wait_calls(seen_t *s, int n)
{
    for (int i = 0; i < 5000 && atomic_load(&s->calls) < n; i++)
        h_sleep_ms(1);
    H_CHECK_EQ(atomic_load(&s->calls), n);
}

/* A receive completes while nobody waits on it: the callback still runs. */
static void case_later(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    char buf[64];
    if (r->rank == 0) {
        (void)h_ctl_recv_u64(r, peer);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_send(ep, "hello", 6, 3, &req));
        H_WAIT_FREE(req, SLIME_OK);
        return;
    }
    seen_t s = {0};
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(ep, buf, sizeof buf, 3, &req));
    H_CHECK_OK(slime_req_on_complete(req, record, &s));
    H_CHECK_STATUS(slime_req_on_complete(req, record, &s), SLIME_ERR_BUSY);
    h_ctl_send_u64(r, peer, 1);
    wait_calls(&s, 1);
    H_CHECK(!pthread_equal(s.thread, pthread_self()));
    H_CHECK_EQ(atomic_load(&s.status), SLIME_OK);
    H_CHECK(strcmp(buf, "hello") == 0);
    h_sleep_ms(20);
    H_CHECK_EQ(atomic_load(&s.calls), 1); /* exactly once */
    slime_req_free(req);
}

/* Already complete: called at once, in this thread; a canceled receive
 * reports its failure to the callback. */
static void case_now_and_failed(h_rank_t *r)
{
    if (r->rank != 0) return;
    slime_ep_t *ep = r->ep[h_peer(r)];
    char buf[8];
    seen_t s = {0};
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(ep, buf, sizeof buf, 99, &req));
    H_CHECK_OK(slime_req_cancel(req));
    H_CHECK_OK(slime_req_on_complete(req, record, &s));
    H_CHECK_EQ(atomic_load(&s.calls), 1);
    H_CHECK(pthread_equal(s.thread, pthread_self()));
    H_CHECK_EQ(atomic_load(&s.status), (unsigned long long)SLIME_ERR_CANCELED);
    slime_req_free(req);
    H_CHECK_STATUS(slime_req_on_complete(NULL, record, &s), SLIME_ERR_INVAL);
}

/* Freed while pending: the callback still runs once, then the request is
 * freed by the library (ASan checks both halves). */
static void case_freed_pending(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    static char big[1 << 20];
    if (r->rank == 1) {
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_recv(ep, big, sizeof big, 5, &req));
        H_WAIT_FREE(req, SLIME_OK);
        h_ctl_send_u64(r, peer, 1);
        return;
    }
    seen_t s = {0};
    slime_req_t *req = NULL;
    memset(big, 7, sizeof big);
    H_CHECK_OK(slime_send(ep, big, sizeof big, 5, &req));
    H_CHECK_OK(slime_req_on_complete(req, record, &s));
    slime_req_free(req);
    (void)h_ctl_recv_u64(r, peer);
    wait_calls(&s, 1);
    H_CHECK_EQ(atomic_load(&s.status), SLIME_OK);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"later", case_later, 2, false, 0},
        {"now_and_failed", case_now_and_failed, 2, false, 0},
        {"freed_pending", case_freed_pending, 2, false, 0},
    };
    return h_main("test_callback", cases, sizeof cases / sizeof cases[0], argc, argv);
}
