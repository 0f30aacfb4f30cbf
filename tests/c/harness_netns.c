/*
 * harness_netns.c - ranks in network namespaces of their own: peers of
 * one host that reach each other as if from two hosts (two addresses, a
 * veth pair between them), for the paths chosen by where a peer is.
 */
#include "harness.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs a shell command; false (logged) if it failed. */
static bool sh(const char *cmd) {
    int st = system(cmd);
    if (st != 0) h_log("'%s' failed (%d)", cmd, st);
    return st == 0;
}

bool h_own_netns(h_rank_t *r) {
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
