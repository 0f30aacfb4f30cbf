/*
 * harness_ctl.c - the out-of-band control channel between ranks (framed
 * messages over socketpairs), barriers, address exchange and killing.
 */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int ctl_fd(h_rank_t *r, int other)
{
    if (other < 0 || other >= r->nranks || other == r->rank ||
        (r->rank != 0 && other != 0))
        h_fail(__FILE__, __LINE__, "no control socket from rank %d to %d",
               r->rank, other);
    if (r->ctl[other] < 0)
        h_fail(__FILE__, __LINE__, "control socket to rank %d is closed",
               other);
    return r->ctl[other];
}

static void send_all(int fd, int to, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        /* MSG_NOSIGNAL: a dead peer is a test failure, not a SIGPIPE. */
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            h_fail(__FILE__, __LINE__, "control send to rank %d: %s", to,
                   strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void recv_all(int fd, int from, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ready = poll(&pfd, 1, h_case_seconds() * 1000);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            h_fail(__FILE__, __LINE__, "no control message from rank %d",
                   from);
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            h_fail(__FILE__, __LINE__,
                   "rank %d closed its control socket (it failed or died)",
                   from);
        if (n < 0)
            h_fail(__FILE__, __LINE__, "control recv from rank %d: %s", from,
                   strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

void h_ctl_send(h_rank_t *r, int to, const void *buf, size_t len)
{
    int fd = ctl_fd(r, to);
    uint32_t n = (uint32_t)len;
    H_CHECK(len <= UINT32_MAX);
    send_all(fd, to, &n, sizeof n);
    send_all(fd, to, buf, len);
}

size_t h_ctl_recv(h_rank_t *r, int from, void *buf, size_t cap)
{
    int fd = ctl_fd(r, from);
    uint32_t n = 0;
    recv_all(fd, from, &n, sizeof n);
    if (n > cap)
        h_fail(__FILE__, __LINE__,
               "control message of %u bytes from rank %d, room for %zu", n,
               from, cap);
    recv_all(fd, from, buf, n);
    return n;
}

void h_ctl_send_u64(h_rank_t *r, int to, uint64_t v)
{
    h_ctl_send(r, to, &v, sizeof v);
}

uint64_t h_ctl_recv_u64(h_rank_t *r, int from)
{
    uint64_t v = 0;
    H_CHECK_EQ(h_ctl_recv(r, from, &v, sizeof v), sizeof v);
    return v;
}

void h_barrier(h_rank_t *r)
{
    uint8_t token = 0xB7;
    if (r->rank != 0) {
        h_ctl_send(r, 0, &token, 1);
        H_CHECK_EQ(h_ctl_recv(r, 0, &token, 1), 1);
        return;
    }
    for (int k = 1; k < r->nranks; k++)
        if (!r->gone[k])
            H_CHECK_EQ(h_ctl_recv(r, k, &token, 1), 1);
    for (int k = 1; k < r->nranks; k++)
        if (!r->gone[k])
            h_ctl_send(r, k, &token, 1);
}

int h_peer(const h_rank_t *r)
{
    H_CHECK_EQ(r->nranks, 2);
    return 1 - r->rank;
}

size_t h_exchange_addresses(h_rank_t *r, slime_ctx_t *ctx,
                            uint8_t blobs[][SLIME_ADDRESS_MAX], size_t *lens)
{
    lens[r->rank] = h_ctx_address(ctx, blobs[r->rank]);
    if (r->rank == 0) {
        for (int k = 1; k < r->nranks; k++)
            lens[k] = h_ctl_recv(r, k, blobs[k], SLIME_ADDRESS_MAX);
        for (int k = 1; k < r->nranks; k++)
            for (int j = 0; j < r->nranks; j++)
                h_ctl_send(r, k, blobs[j], lens[j]);
    } else {
        h_ctl_send(r, 0, blobs[r->rank], lens[r->rank]);
        for (int j = 0; j < r->nranks; j++)
            lens[j] = h_ctl_recv(r, 0, blobs[j], SLIME_ADDRESS_MAX);
    }
    return lens[r->rank];
}

void h_connect_all(h_rank_t *r, slime_ctx_t *ctx, slime_ep_t **eps)
{
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS] = {0};

    h_exchange_addresses(r, ctx, blobs, lens);
    /* Every pair dials each other at about the same time: the header
     * promises they end up sharing one connection. */
    for (int j = 0; j < r->nranks; j++) {
        eps[j] = NULL;
        if (j == r->rank)
            continue;
        H_CHECK_OK(slime_ep_connect(ctx, blobs[j], lens[j], H_WAIT_MS,
                                    &eps[j]));
        H_CHECK(eps[j] != NULL);
        H_CHECK_OK(slime_ep_status(eps[j]));
    }
}

void h_kill_rank(h_rank_t *r, int k)
{
    H_CHECK(r->rank == 0 && k > 0 && k < r->nranks && !r->gone[k]);
    H_CHECK(kill(r->pid[k], SIGKILL) == 0);
    r->gone[k] = true;
    close(r->ctl[k]);
    r->ctl[k] = -1;
}
