/*
 * test_tcp_sndbuf.c - the send buffer of a tcp connection to a peer on
 * this host (transport/sockio.c): fixed at DLSLIME_TCP_SNDBUF (256 KiB
 * by default; the kernel caps it at net.core.wmem_max and reports it
 * doubled), left to the kernel's
 * autotuning when that is 0, and for a peer reached at another address
 * (two network namespaces, as two hosts would be).  Both ranks use tcp
 * whatever the environment forces.  Each case moves rendezvous both
 * ways first, so that autotuning, where it is on, has had bytes to grow
 * the buffer by, then reads SO_SNDBUF of every connected inet stream
 * socket this process holds: the context's only ones (the harness talks
 * over unix socketpairs).
 */
#include "harness.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define TAG 50

static const size_t sizes[] = {300 * H_KIB, 4 * H_MIB + 3};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* SO_SNDBUF of each connected inet stream socket of this process, into
 * out (at most cap); how many there are. */
static int connected_sndbufs(int *out, int cap) {
    DIR *d = opendir("/proc/self/fd");
    H_CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name), domain = 0, type = 0, buf = 0;
        socklen_t l = sizeof domain;
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        struct stat st;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) != 0 || domain != AF_INET) continue;
        l = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM) continue;
        if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0) continue; /* the listener */
        l = sizeof buf;
        H_CHECK(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, &l) == 0);
        if (n < cap) out[n] = buf;
        n++;
    }
    closedir(d);
    return n;
}

/* Moves the sizes both ways on a fresh tcp context made with
 * DLSLIME_TCP_SNDBUF=mode (unset: NULL); returns the send buffer of its
 * one connection. */
static int sndbuf_after_traffic(h_rank_t *r, const char *mode) {
    slime_ep_t *ep = NULL;
    slime_ctx_t *ctx = h_pair_ctx(r, "tcp", "DLSLIME_TCP_SNDBUF", mode, &ep);
    h_rendezvous_both_ways(r, ep, sizes, NSIZES, TAG);
    int bufs[4];
    H_CHECK_EQ(connected_sndbufs(bufs, 4), 1);
    h_barrier(r); /* the peer's context, and so our socket, stays up till both looked */
    slime_ctx_destroy(ctx);
    return bufs[0];
}

/* What the kernel reports for SO_SNDBUF of `bytes`: at most
 * net.core.wmem_max (212992 on a stock kernel), doubled. */
static int granted(size_t bytes) {
    FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
    H_CHECK(f != NULL);
    unsigned long cap = 0;
    H_CHECK(fscanf(f, "%lu", &cap) == 1);
    fclose(f);
    return 2 * (int)(bytes < cap ? bytes : cap);
}

static void case_default(h_rank_t *r) {
    H_CHECK_EQ(sndbuf_after_traffic(r, NULL), granted(256 * H_KIB));
}

static void case_sized(h_rank_t *r) {
    H_CHECK_EQ(sndbuf_after_traffic(r, "150K"), granted(150 * H_KIB));
}

/* Autotuning grew the buffer past its start (tcp_wmem's middle value,
 * 16 KiB by default) for the 4 MiB messages; a fixed one never moves. */
static void case_autotuned(h_rank_t *r) {
    int buf = sndbuf_after_traffic(r, "0");
    H_CHECK(buf != granted(256 * H_KIB));
    H_CHECK(buf > 64 * (int)H_KIB);
}

/* A peer at another address keeps autotuning: the window must cover a
 * path this host cannot see. */
static void case_other_address(h_rank_t *r) {
    int fixed = granted(256 * H_KIB); /* wmem_max may not show in a new namespace */
    if (!h_own_netns(r)) {
        h_log("not run: two network namespaces cannot be made here");
        return;
    }
    H_CHECK(sndbuf_after_traffic(r, NULL) != fixed);
}

int main(int argc, char **argv) {
    static const h_case_t cases[] = {
        {"default", case_default, 2, true, 0},
        {"sized", case_sized, 2, true, 0},
        {"autotuned", case_autotuned, 2, true, 0},
        {"other_address", case_other_address, 2, true, 0},
    };
    return h_main("test_tcp_sndbuf", cases, sizeof cases / sizeof cases[0], argc, argv);
}
