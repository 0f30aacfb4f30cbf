/*
 * test_tcp_cma.c - rendezvous by CMA between tcp peers of one host
 * (transport/tcp_cma.c).  Both ranks use tcp whatever the environment
 * forces; DLSLIME_TCP_CMA=1 lets two processes of one network namespace
 * use the path that peers in different ones take by default.  Each case
 * moves rendezvous both ways (so the dialer and the acceptor each prove
 * the other local), with the receive posted before and after the
 * announcement, and checks every byte and who fetched what.  The case
 * the path is for, two network namespaces joined by a veth pair, runs
 * where namespaces can be made (root), and says why where they cannot.
 */
#include "harness.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define TAG 40

/* Past the eager limit (256 KiB), below and above the copy team's. */
static const size_t sizes[] = {300 * H_KIB, 4 * H_MIB + 3, 17 * H_MIB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Moves every size both ways over tcp; returns this rank's CMA fetches. */
static uint64_t exchange(h_rank_t *r, const char *mode) {
    return h_rendezvous_counted(r, "tcp", "DLSLIME_TCP_CMA", mode, sizes, NSIZES, TAG,
                                SLIME_COUNTER_TCP_CMA_FETCHES);
}

/* Proven local, every rendezvous is fetched by its receiver. */
static void case_fetched(h_rank_t *r) {
    H_CHECK_EQ(exchange(r, "1"), NSIZES);
}

/* Past DLSLIME_TCP_CMA_MAX a rendezvous takes the socket: of the sizes,
 * only the first is fetched. */
static void case_limit(h_rank_t *r) {
    H_CHECK(setenv("DLSLIME_TCP_CMA_MAX", "1M", 1) == 0);
    H_CHECK_EQ(exchange(r, "1"), 1);
}

/* Switched off, and by default between processes of one network
 * namespace (tcp asked for there is tcp), every byte takes the stream. */
static void case_stream(h_rank_t *r) {
    H_CHECK_EQ(exchange(r, "0"), 0);
    H_CHECK_EQ(exchange(r, NULL), 0);
}

/* A receiver the kernel refuses CMA still gets every byte of an offered
 * rendezvous (by a plain CTS and the stream), and offers none itself
 * from then on: nothing is fetched either way. */
static void case_refused(h_rank_t *r) {
    if (r->rank == 1) h_refuse_cma();
    H_CHECK_EQ(exchange(r, "1"), 0);
}

/* Runs a shell command; false (logged) if it failed. */
static bool sh(const char *cmd) {
    int st = system(cmd);
    if (st != 0) h_log("'%s' failed (%d)", cmd, st);
    return st == 0;
}

/* Puts each rank in a network namespace of its own, joined by a veth
 * pair (10.215.0.1 and .2), and makes it listen on its end; false on
 * both ranks when either could not. */
static bool own_netns(h_rank_t *r) {
    const int peer = h_peer(r);
    char cmd[256];
    bool ok = geteuid() == 0 && unshare(CLONE_NEWNET) == 0;
    if (!ok) h_log("no network namespace here (%s)", geteuid() ? "not root" : strerror(errno));
    h_ctl_send_u64(r, peer, ok ? (uint64_t)getpid() : 0);
    uint64_t peer_pid = h_ctl_recv_u64(r, peer);
    if (!ok || !peer_pid) return false;
    if (r->rank == 0) {
        snprintf(cmd, sizeof cmd, "ip link add tcmv0 netns %d type veth peer name tcmv1 netns %llu",
                 (int)getpid(), (unsigned long long)peer_pid);
        ok = sh(cmd);
    }
    h_barrier(r);
    snprintf(cmd, sizeof cmd, "ip addr add 10.215.0.%d/30 dev tcmv%d && ip link set tcmv%d up", r->rank + 1,
             r->rank, r->rank);
    ok = ok && sh(cmd);
    snprintf(cmd, sizeof cmd, "10.215.0.%d", r->rank + 1);
    H_CHECK(setenv("DLSLIME_HOST", cmd, 1) == 0);
    h_ctl_send_u64(r, peer, ok);
    return h_ctl_recv_u64(r, peer) && ok;
}

/* The default: peers in two network namespaces fetch every rendezvous. */
static void case_netns(h_rank_t *r) {
    if (!own_netns(r)) {
        h_log("not run: two network namespaces cannot be made here");
        return;
    }
    H_CHECK_EQ(exchange(r, NULL), NSIZES);
}

int main(int argc, char **argv) {
    static const h_case_t cases[] = {
        {"fetched", case_fetched, 2, true, 0},
        {"limit", case_limit, 2, true, 0},
        {"stream", case_stream, 2, true, 0},
        {"refused", case_refused, 2, true, 0},
        {"netns", case_netns, 2, true, 0},
    };
    return h_main("test_tcp_cma", cases, sizeof cases / sizeof cases[0], argc, argv);
}
