#include "transport/sockio.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"

int sock_wait(int fd, short events, uint64_t deadline_ns) {
    for (;;) {
        uint64_t now = now_ns();
        if (now >= deadline_ns) return 0;
        uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
        if (r > 0) return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -1 : 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

slime_status_t sock_sendmsg_all(int fd, struct msghdr *msg, uint64_t deadline_ns) {
    /* handshake messages are small: one sendmsg normally takes all */
    for (;;) {
        ssize_t n = sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            size_t want = 0;
            for (size_t i = 0; i < msg->msg_iovlen; i++) want += msg->msg_iov[i].iov_len;
            if ((size_t)n == want) return SLIME_OK;
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: short send (%zd of %zu bytes)", n, want);
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: send failed: %s", strerror(errno));
        int w = sock_wait(fd, POLLOUT, deadline_ns);
        if (w == 0) return slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out sending");
        if (w < 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed while sending");
    }
}

slime_status_t sock_recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, MSG_DONTWAIT);
        if (r > 0) { got += (size_t)r; continue; }
        if (r == 0)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: peer closed the connection");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: receive failed: %s", strerror(errno));
        int w = sock_wait(fd, POLLIN, deadline_ns);
        if (w == 0) return slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out waiting for the peer's reply");
        if (w < 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed while receiving");
    }
    return SLIME_OK;
}

void sock_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

bool sock_inet_ends(int fd, struct sockaddr_in *mine, struct sockaddr_in *theirs) {
    socklen_t ml = sizeof *mine, tl = sizeof *theirs;
    return getsockname(fd, (struct sockaddr *)mine, &ml) == 0 &&
           getpeername(fd, (struct sockaddr *)theirs, &tl) == 0 && mine->sin_family == AF_INET &&
           theirs->sin_family == AF_INET;
}

/* Whether both ends of the connected socket fd have one address: a
 * peer on this host (loopback, or our own address). */
bool sock_same_host(int fd) {
    struct sockaddr_in mine, theirs;
    return sock_inet_ends(fd, &mine, &theirs) && mine.sin_addr.s_addr == theirs.sin_addr.s_addr;
}

/* A same-host connection left to the kernel's autotuning grows its send
 * buffer to tcp_wmem's limit (4 MiB by default).  One sendmsg then
 * copies a large message into socket memory far ahead of the receiver's
 * copy, out of cache, and two ranks sending at once (a collective's
 * step) each process the other's segments into a backlog.  A fixed
 * buffer keeps the two copies in step.  p2p_bench tcp, old and new
 * alternating: sendrecv 1 MiB 256 -> 146 us, 16 MiB 5109 -> 2176;
 * allreduce 64 KiB 53 -> 25 us, 16 MiB 6144 -> 4849.  Across hosts the
 * window must cover the path's bandwidth times its delay, which only
 * autotuning knows: those connections keep it. */
static void sock_size_same_host(int fd) {
    if (env_off("DLSLIME_TCP_SNDBUF") || !sock_same_host(fd)) return;
    int bytes = (int)min_sz(env_size("DLSLIME_TCP_SNDBUF", 256 * 1024), INT_MAX / 2);
    /* the kernel caps it at net.core.wmem_max (208 KiB on a stock
     * kernel, as good here: 192 KiB measured level) and doubles it */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

void sock_tune_tcp(int fd) {
    int one = 1, idle = 5, intvl = 1, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    sock_size_same_host(fd);
}

slime_status_t sock_connect_tcp(const char *who, uint32_t host, uint16_t port, uint64_t deadline,
                                int *fd_out) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &host, ip, sizeof ip);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return slime_errorf(SLIME_ERR_SYSTEM, "%s: socket: %s", who, strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = host;
    slime_status_t st;
    int err = 0;
    socklen_t el = sizeof err;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        st = slime_errorf(SLIME_ERR_PEER_LOST, "%s: connect to %s:%u: %s", who, ip, port, strerror(errno));
        goto fail;
    }
    if (sock_wait(fd, POLLOUT, deadline) == 0) {
        st = slime_errorf(SLIME_ERR_TIMEOUT, "%s: connect to %s:%u timed out", who, ip, port);
        goto fail;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
        st = slime_errorf(SLIME_ERR_PEER_LOST, "%s: connect to %s:%u: %s", who, ip, port,
                          strerror(err ? err : errno));
        goto fail;
    }
    sock_tune_tcp(fd);
    *fd_out = fd;
    return SLIME_OK;
fail:
    close(fd);
    return st;
}

int sock_peer_hosts(const slime_ctx_t *ctx, const wire_addr_t *peer, uint32_t order[]) {
    int n = 0;
    if (address_same_host(&ctx->addr, peer)) order[n++] = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < peer->n_hosts && i < WIRE_MAX_HOSTS; i++)
        if (n == 0 || peer->hosts[i] != order[0]) order[n++] = peer->hosts[i];
    return n;
}

uint64_t sock_try_deadline(uint64_t deadline, int i, int n) {
    uint64_t now = now_ns();
    if (now >= deadline) return now;
    uint64_t slice = (deadline - now) / (uint64_t)(n - i);
    if (slice < 1000000000ull) slice = deadline - now;
    return now + slice;
}

bool sock_accept_pending(slime_ctx_t *ctx, int lfd, int transport, void (*tune)(int fd)) {
    for (int i = 0; i < 64; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            bool starved = errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM;
            if (!starved) return true; /* EAGAIN, or a connection that died already */
            /* room for one connection and the fds a hello brings (shm: 2) */
            if (!pending_conn_evict(ctx, 3)) return false;
            continue;
        }
        if (tune) tune(fd);
        pending_conn_add(ctx, fd, transport);
    }
    return true;
}
