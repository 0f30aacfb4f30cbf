/* The tcp transport: non-blocking sockets driven by the progress engine.
 * Reads of small frames go through a staging buffer (one syscall for many
 * frames); large payloads are received straight into their destination. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/sockio.h"
#include "transport/transport.h"

#define STAGE_SIZE (64 * 1024)

typedef struct tcp_conn {
    int fd;
    size_t stage_off, stage_len;
    uint8_t stage[STAGE_SIZE];
} tcp_conn_t;

static tcp_conn_t *tcp_conn_new(int fd) {
    tcp_conn_t *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->stage_off = c->stage_len = 0;
    return c;
}

slime_status_t tcp_listen(slime_ctx_t *ctx, const char *host, uint16_t port,
                          int *fd_out, uint16_t *bound_port) {
    (void)ctx;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (host && *host) {
        if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
            return slime_errorf(SLIME_ERR_INVAL, "tcp host '%s' is not an IPv4 address", host);
    } else {
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return slime_errorf(SLIME_ERR_SYSTEM, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 256) < 0) {
        int e = errno;
        close(fd);
        return slime_errorf(SLIME_ERR_SYSTEM, "tcp listen on %s:%u: %s", host && *host ? host : "0.0.0.0",
                            port, strerror(e));
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound_port = ntohs(sa.sin_port);
    *fd_out = fd;
    return SLIME_OK;
}

void listener_accept(slime_ctx_t *ctx, int lfd, int transport) {
    for (int i = 0; i < 64; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or a connection that died already */
        if (transport == WIRE_TRANSPORT_TCP) sock_tune_tcp(fd);
        pending_conn_add(ctx, fd, transport);
    }
}

static slime_status_t dial_one(slime_ctx_t *ctx, uint32_t host, uint16_t port,
                               uint64_t deadline, int *fd_out, wire_welcome_t *w) {
    int fd;
    slime_status_t st = sock_connect_tcp("tcp", host, port, deadline, &fd);
    if (st != SLIME_OK) return st;
    wire_hello_t h;
    hello_fill(ctx, WIRE_TRANSPORT_TCP, &h);
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if ((st = sock_sendmsg_all(fd, &msg, deadline)) != SLIME_OK ||
        (st = sock_recv_all(fd, w, sizeof *w, deadline)) != SLIME_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return SLIME_OK;
}

static slime_status_t tcp_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline,
                               void **conn, int *fd, wire_welcome_t *w) {
    if (!(peer->flags & ADDR_HAS_TCP) || peer->n_hosts == 0)
        return slime_errorf(SLIME_ERR_UNSUPPORTED, "peer %016llx has no tcp listener",
                            (unsigned long long)peer->ctx_id);
    uint32_t order[WIRE_MAX_HOSTS + 1];
    int n = sock_peer_hosts(ctx, peer, order);
    slime_status_t st = SLIME_ERR_PEER_LOST;
    for (int i = 0; i < n && now_ns() < deadline; i++) {
        st = dial_one(ctx, order[i], peer->tcp_port, sock_try_deadline(deadline, i, n), fd, w);
        if (st == SLIME_OK) {
            if (!(*conn = tcp_conn_new(*fd))) { close(*fd); return slime_errorf(SLIME_ERR_NOMEM, "tcp conn"); }
            return SLIME_OK;
        }
    }
    return st;
}

static int tcp_read_hello(slime_ctx_t *ctx, pending_conn_t *pc) {
    (void)ctx;
    for (;;) {
        ssize_t r = recv(pc->fd, (char *)&pc->hello + pc->got, sizeof pc->hello - pc->got, 0);
        if (r == 0) return -1;
        if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        pc->got += (size_t)r;
        /* refuse garbage as soon as its first bytes show it */
        if (pc->got >= 4 && pc->hello.magic != WIRE_HELLO_MAGIC) return -1;
        if (pc->got == sizeof pc->hello) return 1;
    }
}

static slime_status_t tcp_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc,
                                       const wire_welcome_t *w, void **conn) {
    (void)ctx;
    /* a fresh socket's send buffer always has room for the welcome */
    ssize_t n = send(pc->fd, w, sizeof *w, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != (ssize_t)sizeof *w) return slime_errorf(SLIME_ERR_PEER_LOST, "welcome not sent");
    if (conn && !(*conn = tcp_conn_new(pc->fd))) return slime_errorf(SLIME_ERR_NOMEM, "tcp conn");
    return SLIME_OK;
}

static ssize_t broken(slime_ep_t *ep, const char *what, int err) {
    if (err == 0)
        ep_fail(ep, SLIME_ERR_PEER_LOST, "peer closed the connection");
    else
        ep_fail(ep, SLIME_ERR_PEER_LOST, "tcp %s: %s", what, strerror(err));
    return SLIME_ERR_PEER_LOST;
}

static ssize_t tcp_read(slime_ep_t *ep, void *dst, size_t n) {
    tcp_conn_t *c = ep->conn;
    if (c->stage_off < c->stage_len) {
        size_t k = min_sz(n, c->stage_len - c->stage_off);
        memcpy(dst, c->stage + c->stage_off, k);
        c->stage_off += k;
        return (ssize_t)k;
    }
    /* big reads go straight to their destination */
    int direct = n >= STAGE_SIZE / 2;
    ssize_t r = recv(c->fd, direct ? dst : (void *)c->stage, direct ? n : STAGE_SIZE, MSG_DONTWAIT);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return broken(ep, "receive", errno);
    }
    if (r == 0) return broken(ep, "receive", 0);
    if (direct) return r;
    c->stage_off = 0;
    c->stage_len = (size_t)r;
    size_t k = min_sz(n, c->stage_len);
    memcpy(dst, c->stage, k);
    c->stage_off = k;
    return (ssize_t)k;
}

static ssize_t tcp_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    tcp_conn_t *c = ep->conn;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    ssize_t r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return broken(ep, "send", errno);
}

static bool tcp_rx_ready(slime_ep_t *ep) {
    tcp_conn_t *c = ep->conn;
    return c->stage_off < c->stage_len;
}

static void tcp_fd_event(slime_ep_t *ep, uint32_t events) { (void)ep; (void)events; }

static void tcp_close(slime_ep_t *ep) {
    tcp_conn_t *c = ep->conn;
    if (!c) return;
    close(c->fd);
    free(c);
    ep->conn = NULL;
}

const transport_ops_t slime_tcp_transport = {
    .name = "tcp",
    .wire = WIRE_TRANSPORT_TCP,
    .dial = tcp_dial,
    .read_hello = tcp_read_hello,
    .send_welcome = tcp_send_welcome,
    .read = tcp_read,
    .writev = tcp_writev,
    .rx_ready = tcp_rx_ready,
    .fd_event = tcp_fd_event,
    .rma = NULL,
    .close = tcp_close,
};
