/*
 * test_verbs_linkdown.c - the network between two RDMA devices goes away
 * while the peer process lives on: only the queue pair can tell (the
 * liveness socket runs over loopback).
 *
 * link_down: the QP runs out of retries.  The pending read fails with
 * SLIME_ERR_PEER_LOST within the timeout, its error text names the
 * work-completion status, and the endpoint is down.
 *
 * stall: the retries would take minutes (ack timeout 68 s), so the stall
 * watchdog (DLSLIME_VERBS_STALL_MS, 2 s here) fails the read first, as
 * it would a device that never completes nor fails a request.
 *
 * Needs two devices on the two ends of a link the test may take down:
 * the soft-RoCE VM (tests/verbs/run_in_vm.sh) has rxe0 on veth0 and rxe1
 * on veth1 and sets DLSLIME_TEST_NETDEV=veth1; elsewhere it skips.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION (16u << 20)

static void link_set(const char *dev, const char *state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip link set %s %s", dev, state);
    if (system(cmd) != 0)
        h_fail(__FILE__, __LINE__, "'%s' failed", cmd);
    h_log("%s", cmd);
}

/* A read of rank 1's region with the link down fails with PEER_LOST, its
 * text containing want, within max_ms. */
static void read_with_link_down(h_rank_t *r, const char *want, int64_t max_ms)
{
    const char *dev = getenv("DLSLIME_TEST_NETDEV");
    if (r->rank == 1) {
        uint8_t *buf = h_alloc(REGION);
        slime_mr_t *mr = h_mr_reg(r->ctx, buf, REGION, SLIME_ACCESS_ALL);
        h_send_desc(r, 0, mr);
        (void)h_ctl_recv_u64(r, 0);
        /* our side learns it from the socket once rank 0 gives up */
        int64_t start = h_now_ms();
        while (slime_ep_status(r->ep[0]) == SLIME_OK && h_now_ms() - start < 10000)
            h_sleep_ms(10);
        H_CHECK_EQ(slime_ep_status(r->ep[0]), SLIME_ERR_PEER_LOST);
        H_CHECK_OK(slime_mr_dereg(mr));
        free(buf);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    uint8_t *buf = h_alloc(REGION);
    slime_mr_t *mr = h_mr_reg(r->ctx, buf, REGION, 0);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_read(r->ep[1], mr, 0, &remote, 0, 4096, &req));
    H_WAIT_FREE(req, SLIME_OK);
    link_set(dev, "down");
    int64_t start = h_now_ms();
    H_CHECK_OK(slime_read(r->ep[1], mr, 0, &remote, 0, REGION, &req));
    slime_status_t st = slime_req_wait(req, H_WAIT_MS);
    const char *why = slime_req_error(req);
    h_log("read with the link down: %s after %lld ms: %s", slime_status_name(st), (long long)(h_now_ms() - start),
          why);
    int64_t took = h_now_ms() - start;
    link_set(dev, "up");
    H_CHECK_EQ(st, SLIME_ERR_PEER_LOST);
    H_CHECK(strstr(why, want) != NULL);
    H_CHECK(took <= max_ms);
    slime_req_free(req);
    H_CHECK_EQ(slime_ep_status(r->ep[1]), SLIME_ERR_PEER_LOST);
    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

static void case_link_down(h_rank_t *r)
{
    /* the text names the work completion and its status */
    read_with_link_down(r, "work completion", H_WAIT_MS);
}

static void case_stall(h_rank_t *r)
{
    /* ack timeout 4.096 us * 2^24 = 68 s: the retries never end in time */
    setenv("DLSLIME_VERBS_TIMEOUT", "24", 1);
    setenv("DLSLIME_VERBS_STALL_MS", "2000", 1);
    r->ctx = h_ctx_create(NULL);
    h_connect_all(r, r->ctx, r->ep);
    read_with_link_down(r, "the device stalled", 15000);
    h_barrier(r);
    slime_ctx_destroy(r->ctx);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"link_down", case_link_down, 2, false, 0},
        {"stall", case_stall, 2, true, 0},
    };
    const char *dev = getenv("DLSLIME_TEST_NETDEV");
    if (strcmp(h_transport(), "verbs") != 0 || dev == NULL || *dev == '\0') {
        fprintf(stderr, "[test_verbs_linkdown] SKIP: needs DLSLIME_TRANSPORT=verbs and a link it may take "
                        "down (DLSLIME_TEST_NETDEV), as tests/verbs/run_in_vm.sh provides\n");
        return H_SKIP_EXIT;
    }
    /* rank 0 on rxe0, rank 1 on rxe1 (by LOCAL_RANK); give up quickly:
     * ack timeout 4.096 us * 2^12 = 16 ms, 3 retries */
    setenv("DLSLIME_VERBS_DEVICES", "rxe0,rxe1", 0);
    setenv("DLSLIME_VERBS_TIMEOUT", "12", 0);
    setenv("DLSLIME_VERBS_RETRY", "3", 0);
    return h_main("test_verbs_linkdown", cases, sizeof cases / sizeof cases[0], argc, argv);
}
