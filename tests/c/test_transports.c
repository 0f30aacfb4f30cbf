/*
 * test_transports.c - what a transport's table decides for it: each
 * transport has its own eager limit ($DLSLIME_EAGER_<NAME>), and the
 * names DLSLIME_TRANSPORT accepts are the provider table's.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG 31

/* Distinct limits, so a transport that took another one's would fail. */
static const struct {
    const char *name, *env;
    size_t eager;
} limits[] = {
    {"shm", "DLSLIME_EAGER_SHM", 1000},
    {"tcp", "DLSLIME_EAGER_TCP", 2000},
    {"verbs", "DLSLIME_EAGER_VERBS", 3000},
};

static size_t limit_of(const char *transport)
{
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (strcmp(limits[i].name, transport) == 0)
            return limits[i].eager;
    h_fail(__FILE__, __LINE__, "no limit for transport %s", transport);
}

/* A send up to the limit goes eagerly: it completes before any receive
 * is posted.  One byte more goes by rendezvous: it waits for the
 * receive.  Both arrive whole. */
static void case_eager_limit(h_rank_t *r)
{
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        char val[32];
        snprintf(val, sizeof val, "%zu", limits[i].eager);
        H_CHECK(setenv(limits[i].env, val, 1) == 0);
    }
    const int peer = h_peer(r);
    slime_ctx_t *ctx = h_ctx_create(NULL);
    slime_ep_t *eps[H_MAX_RANKS] = {NULL};
    h_connect_all(r, ctx, eps);
    slime_ep_t *ep = eps[peer];
    const size_t limit = limit_of(slime_ep_transport(ep));
    h_log("transport %s, eager limit %zu", slime_ep_transport(ep), limit);
    uint8_t *buf = h_alloc(limit + 1);
    if (r->rank == 0) {
        slime_req_t *eager = NULL, *rndv = NULL;
        h_fill(buf, limit + 1, 5, 0);
        H_CHECK_OK(slime_send(ep, buf, limit, TAG, &eager));
        H_WAIT_FREE(eager, SLIME_OK);
        H_CHECK_OK(slime_send(ep, buf, limit + 1, TAG + 1, &rndv));
        H_CHECK_STATUS(slime_req_wait(rndv, 300), SLIME_ERR_TIMEOUT);
        h_ctl_send_u64(r, peer, 1); /* now receive */
        H_WAIT_FREE(rndv, SLIME_OK);
    } else {
        slime_req_t *a = NULL, *b = NULL;
        (void)h_ctl_recv_u64(r, peer);
        H_CHECK_OK(slime_recv(ep, buf, limit, TAG, &a));
        H_WAIT(a, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(a), limit);
        H_CHECK_PATTERN(buf, limit, 5, 0);
        slime_req_free(a);
        H_CHECK_OK(slime_recv(ep, buf, limit + 1, TAG + 1, &b));
        H_WAIT(b, SLIME_OK);
        H_CHECK_EQ(slime_req_bytes(b), limit + 1);
        H_CHECK_PATTERN(buf, limit + 1, 5, 0);
        slime_req_free(b);
    }
    h_barrier(r);
    free(buf);
    slime_ctx_destroy(ctx);
}

/* An unknown name is refused with the list of the table's transports;
 * each of those is known (a context may still be unable to use it). */
static void case_names(h_rank_t *r)
{
    (void)r;
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    opts.transport = "carrier-pigeon";
    slime_ctx_t *ctx = NULL;
    H_CHECK_STATUS(slime_ctx_create(&opts, &ctx), SLIME_ERR_INVAL);
    H_CHECK(ctx == NULL);
    char detail[512];
    snprintf(detail, sizeof detail, "%s", slime_last_error());
    h_log("%s", detail);
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        H_CHECK(strstr(detail, limits[i].name) != NULL);
        opts.transport = limits[i].name;
        slime_status_t st = slime_ctx_create(&opts, &ctx);
        H_CHECK(st == SLIME_OK || st == SLIME_ERR_UNSUPPORTED);
        if (st == SLIME_OK)
            slime_ctx_destroy(ctx);
        ctx = NULL;
    }
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"eager_limit", case_eager_limit, 2, true, 0},
        {"names", case_names, 1, true, 0},
    };
    return h_main("test_transports", cases, sizeof cases / sizeof cases[0],
                  argc, argv);
}
