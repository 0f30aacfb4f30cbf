/*
 * test_verbs_native.c - what only native RDMA can do: the peer's process
 * is stopped (SIGSTOP) and still its memory is read and written, its
 * large message is fetched, and immediates land in its queue; all
 * checked against the bytes sent once it runs again.  Over a transport
 * that serves one-sided ops or rendezvous in the peer's progress engine
 * these would hang, so the program runs under DLSLIME_TRANSPORT=verbs only
 * (elsewhere it skips, saying why).
 */
#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG (64u << 20)
#define SEED_SRC 0x5EED1
#define SEED_DST 0x5EED2
#define SEED_MSG 0x5EED3
#define IMM 0xC0DE0001u

static void stop_rank(h_rank_t *r, int k, int sig)
{
    if (kill(r->pid[k], sig) != 0)
        h_fail(__FILE__, __LINE__, "kill(rank %d, %d) failed", k, sig);
    h_log("sent signal %d to rank %d", sig, k);
}

/* Rank 1's memory is read and written by rank 0 while rank 1 is stopped:
 * 64 MiB each way, then a write_imm whose immediate rank 1 finds once it
 * runs again. */
static void case_stopped_target(h_rank_t *r)
{
    if (r->rank == 1) {
        uint8_t *src = h_alloc(BIG), *dst = h_alloc(BIG);
        h_fill(src, BIG, SEED_SRC, 0);
        slime_mr_t *msrc = h_mr_reg(r->ctx, src, BIG, SLIME_ACCESS_REMOTE_READ);
        slime_mr_t *mdst = h_mr_reg(r->ctx, dst, BIG, SLIME_ACCESS_REMOTE_WRITE);
        h_send_desc(r, 0, msrc);
        h_send_desc(r, 0, mdst);
        (void)h_ctl_recv_u64(r, 0); /* sent after we were continued */
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_imm_recv(r->ep[0], &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_imm(req), IMM);
        slime_req_free(req);
        H_CHECK_PATTERN(dst, BIG, SEED_DST, 0);
        H_CHECK_PATTERN(src, BIG, SEED_SRC, 0);
        H_CHECK_OK(slime_mr_dereg(msrc));
        H_CHECK_OK(slime_mr_dereg(mdst));
        free(src);
        free(dst);
        return;
    }
    slime_mr_desc_t src = h_recv_desc(r, 1), dst = h_recv_desc(r, 1);
    uint8_t *in = h_alloc(BIG), *out = h_alloc(BIG);
    h_fill(out, BIG, SEED_DST, 0);
    slime_mr_t *min = h_mr_reg(r->ctx, in, BIG, 0), *mout = h_mr_reg(r->ctx, out, BIG, 0);
    slime_req_t *req = NULL;
    /* first use of each region while rank 1 runs: its owner is asked once */
    H_CHECK_OK(slime_read(r->ep[1], min, 0, &src, 0, 4096, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_write(r->ep[1], mout, 0, &dst, 0, 4096, &req));
    H_WAIT_FREE(req, SLIME_OK);

    stop_rank(r, 1, SIGSTOP);
    H_CHECK_OK(slime_read(r->ep[1], min, 0, &src, 0, BIG, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(in, BIG, SEED_SRC, 0);
    H_CHECK_OK(slime_write(r->ep[1], mout, 0, &dst, 0, BIG - 4096, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_write_imm(r->ep[1], mout, BIG - 4096, &dst, BIG - 4096, 4096, IMM, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_ep_status(r->ep[1]));
    stop_rank(r, 1, SIGCONT);

    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_mr_dereg(min));
    H_CHECK_OK(slime_mr_dereg(mout));
    free(in);
    free(out);
}

/* Rank 1 posts a 64 MiB send and is stopped; rank 0 receives all of it
 * (fetched by RDMA READ from rank 1's buffer), then rank 1 runs again and
 * its send completes. */
static void case_stopped_sender(h_rank_t *r)
{
    if (r->rank == 1) {
        uint8_t *buf = h_alloc(BIG);
        h_fill(buf, BIG, SEED_MSG, 0);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_send(r->ep[0], buf, BIG, 42, &req));
        h_ctl_send_u64(r, 0, 1);
        H_WAIT_FREE(req, SLIME_OK);
        free(buf);
        return;
    }
    (void)h_ctl_recv_u64(r, 1);
    stop_rank(r, 1, SIGSTOP);
    uint8_t *buf = h_alloc(BIG + 64);
    memset(buf + BIG, 0xEE, 64);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_recv(r->ep[1], buf, BIG, 42, &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), BIG);
    slime_req_free(req);
    H_CHECK_PATTERN(buf, BIG, SEED_MSG, 0);
    H_CHECK_BYTES(buf + BIG, 64, 0xEE);
    stop_rank(r, 1, SIGCONT);
    free(buf);
}

/* The endpoint says which device it runs on; with
 * $DLSLIME_TEST_EXPECT_GID set (tests/verbs/ipv4_gids.sh), the GID it
 * chose must contain that text. */
static void case_describe(h_rank_t *r)
{
    const char *d = slime_ep_describe(r->ep[h_peer(r)]);
    h_log("endpoint: %s", d);
    H_CHECK(strncmp(d, "verbs ", 6) == 0);
    H_CHECK(strstr(d, " gid[") != NULL && strstr(d, "mtu") != NULL);
    const char *want = getenv("DLSLIME_TEST_EXPECT_GID");
    if (want && *want)
        H_CHECK(strstr(d, want) != NULL);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"stopped_target", case_stopped_target, 2, false, 0},
        {"stopped_sender", case_stopped_sender, 2, false, 0},
        {"describe", case_describe, 2, false, 0},
    };
    if (strcmp(h_transport(), "verbs") != 0) {
        fprintf(stderr, "[test_verbs_native] SKIP: needs DLSLIME_TRANSPORT=verbs (it is %s)\n", h_transport());
        return H_SKIP_EXIT;
    }
    return h_main("test_verbs_native", cases, sizeof cases / sizeof cases[0], argc, argv);
}
