/*
 * test_threads.c - one context used from many threads at once: per rank,
 * four sender threads, four receiver threads and one thread doing one-sided
 * reads, all on the same endpoint.  Every message and every byte read is
 * checked; each tag keeps its order although the threads race.
 */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { NSTREAMS = 4, NMSGS = 200, WINDOW = 8, NREADS = 100 };
#define READ_REGION (1u << 20)
#define READ_LEN 4096u

typedef struct job {
    h_rank_t *r;
    int stream;
    const slime_mr_desc_t *remote;
    slime_mr_t *local;
    uint8_t *local_base;
} job_t;

/* Crosses the eager / rendezvous boundary now and then. */
static size_t msg_len(int stream, int i)
{
    return (size_t)((stream * 977 + i * 131) % 5000) + (i % 50 == 7 ? 200000u : 0u);
}

static uint64_t msg_seed(int sender, int stream, int i)
{
    return (uint64_t)sender * 1000003u + (uint64_t)stream * 1009u + (uint64_t)i;
}

static void *sender(void *arg)
{
    job_t *j = arg;
    slime_ep_t *ep = j->r->ep[h_peer(j->r)];
    slime_req_t *reqs[WINDOW] = {NULL};
    uint8_t *bufs[WINDOW] = {NULL};
    for (int i = 0; i < NMSGS; i++) {
        int w = i % WINDOW;
        if (reqs[w] != NULL) {
            H_WAIT_FREE(reqs[w], SLIME_OK);
            free(bufs[w]);
        }
        size_t len = msg_len(j->stream, i);
        bufs[w] = h_alloc(len);
        h_fill(bufs[w], len, msg_seed(j->r->rank, j->stream, i), 0);
        H_CHECK_OK(slime_send(ep, bufs[w], len, (uint64_t)j->stream,
                              &reqs[w]));
    }
    for (int w = 0; w < WINDOW; w++) {
        H_WAIT_FREE(reqs[w], SLIME_OK);
        free(bufs[w]);
    }
    return NULL;
}

static void *receiver(void *arg)
{
    job_t *j = arg;
    const int peer = h_peer(j->r);
    slime_ep_t *ep = j->r->ep[peer];
    slime_req_t *reqs[WINDOW] = {NULL};
    uint8_t *bufs[WINDOW] = {NULL};
    int index[WINDOW] = {0};
    for (int i = 0; i < NMSGS + WINDOW; i++) {
        int w = i % WINDOW;
        if (reqs[w] != NULL) {
            int k = index[w];
            size_t len = msg_len(j->stream, k);
            H_WAIT(reqs[w], SLIME_OK);
            H_CHECK_EQ(slime_req_bytes(reqs[w]), len);
            H_CHECK_PATTERN(bufs[w], len, msg_seed(peer, j->stream, k), 0);
            slime_req_free(reqs[w]);
            free(bufs[w]);
            reqs[w] = NULL;
        }
        if (i >= NMSGS)
            continue;
        size_t cap = msg_len(j->stream, i);
        bufs[w] = h_alloc(cap);
        index[w] = i;
        H_CHECK_OK(slime_recv(ep, bufs[w], cap, (uint64_t)j->stream,
                              &reqs[w]));
    }
    return NULL;
}

static void *reader(void *arg)
{
    job_t *j = arg;
    const int peer = h_peer(j->r);
    for (int i = 0; i < NREADS; i++) {
        size_t off = ((size_t)i * 7919u) % (READ_REGION - READ_LEN);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_read(j->r->ep[peer], j->local, 0, j->remote, off,
                              READ_LEN, &req));
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_PATTERN(j->local_base, READ_LEN, 0xEAD0 + (uint64_t)peer,
                        off);
    }
    return NULL;
}

static void case_many_threads(h_rank_t *r)
{
    const int peer = h_peer(r);
    uint8_t *region = h_alloc(READ_REGION);
    h_fill(region, READ_REGION, 0xEAD0 + (uint64_t)r->rank, 0);
    slime_mr_t *served = h_mr_reg(r->ctx, region, READ_REGION,
                                  SLIME_ACCESS_REMOTE_READ);
    h_send_desc(r, peer, served);
    slime_mr_desc_t remote = h_recv_desc(r, peer);
    uint8_t *scratch = h_alloc(READ_LEN);
    slime_mr_t *local = h_mr_reg(r->ctx, scratch, READ_LEN, 0);

    pthread_t threads[2 * NSTREAMS + 1];
    job_t jobs[2 * NSTREAMS + 1];
    for (int t = 0; t < 2 * NSTREAMS + 1; t++) {
        jobs[t] = (job_t){.r = r, .stream = t % NSTREAMS, .remote = &remote,
                          .local = local, .local_base = scratch};
        void *(*fn)(void *) = t < NSTREAMS       ? sender
                              : t < 2 * NSTREAMS ? receiver
                                                 : reader;
        H_CHECK(pthread_create(&threads[t], NULL, fn, &jobs[t]) == 0);
    }
    for (int t = 0; t < 2 * NSTREAMS + 1; t++)
        H_CHECK(pthread_join(threads[t], NULL) == 0);

    /* The peer may still be reading our region. */
    h_barrier(r);
    H_CHECK_OK(slime_mr_dereg(local));
    H_CHECK_OK(slime_mr_dereg(served));
    free(scratch);
    free(region);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"many_threads", case_many_threads, 2, false, 0},
    };
    return h_main("test_threads", cases, sizeof cases / sizeof cases[0],
                  argc, argv);
}
