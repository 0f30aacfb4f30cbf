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

/* The default: peers in two network namespaces fetch every rendezvous. */
static void case_netns(h_rank_t *r) {
    if (!h_own_netns(r)) {
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
