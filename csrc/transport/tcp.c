/* The tcp transport: non-blocking sockets driven by the progress engine.
 * Reads of small frames go through a staging buffer (one syscall for many
 * frames), which combining receives fold from in place; large payloads are
 * received straight into their destination; a rendezvous with a peer of
 * this host in another network namespace goes by CMA (tcp_cma.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/cma_fetch.h"
#include "transport/sockio.h"
#include "transport/tcp_cma.h"
#include "transport/transport.h"

/* Bytes whose destination is not known yet (a header, and what comes
 * behind it) are received into the stage and copied out; a combining
 * receive folds them straight from there.  A plain read fills at most
 * STAGE_READ of it (a 16 KiB payload and its header), and reads of
 * STAGE_READ / 2 and more go straight to their destination: a header's
 * read then takes little of a large payload with it (a 64 KiB fill copied
 * nearly all of a 64 KiB eager message a second time).  p2p_bench over
 * tcp, alternating runs, fills of 64 KiB -> STAGE_READ, avg us: sendrecv
 * 64 KiB 17.9 -> 16.9, allreduce 64 KiB 24.1 -> 22.5, 128 KiB 53.8 ->
 * 43.1; 4-32 KiB level.  A combining receive fills the whole stage: with
 * 16 KiB fills a 16 MiB allreduce took 5.3 ms against 4.9. */
#define STAGE_SIZE (64 * 1024)
#define STAGE_READ (16 * 1024 + 64)

typedef struct tcp_conn {
    int fd;
    bool drained;               /* the last receive emptied the socket */
    tcp_cma_t cma;              /* whether rendezvous go by CMA */
    size_t stage_off, stage_len;
    bool same_host;             /* sock_same_host, at the connect */
    uint8_t stage[STAGE_SIZE];
} tcp_conn_t;

static tcp_conn_t *tcp_conn_new(int fd) {
    tcp_conn_t *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->drained = false;
    c->cma.state = TCP_CMA_UNKNOWN;
    c->stage_off = c->stage_len = 0;
    c->same_host = sock_same_host(fd);
    return c;
}

/* What a context keeps: its listener, and the addresses it advertises. */
typedef struct tcp_ctx {
    int listen_fd;
    uint16_t port;
    uint16_t n_hosts;
    uint32_t hosts[WIRE_MAX_HOSTS];
    atomic_uint_fast64_t cma_fetches; /* SLIME_COUNTER_TCP_CMA_FETCHES */
} tcp_ctx_t;

static slime_status_t tcp_listen(const char *host, uint16_t port, int *fd_out, uint16_t *bound_port) {
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

static int list_hosts(uint32_t *hosts) {
    struct ifaddrs *ifs, *i;
    int n = 0;
    if (getifaddrs(&ifs) != 0) return 0;
    /* routable addresses first, loopback last */
    for (int pass = 0; pass < 2; pass++) {
        for (i = ifs; i && n < WIRE_MAX_HOSTS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
            int lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
            if (lo != pass) continue;
            hosts[n++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        }
    }
    freeifaddrs(ifs);
    return n;
}

/* Every context listens on tcp, even with another transport forced:
 * verbs dials through this listener, and a peer forced onto tcp gets a
 * refusal that says why rather than no answer. */
static slime_status_t tcp_ctx_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, enum tp_mode mode, void **state) {
    (void)ctx;
    (void)mode;
    tcp_ctx_t *t = calloc(1, sizeof *t);
    if (!t) return slime_errorf(SLIME_ERR_NOMEM, "tcp listener");
    const char *host = opts->tcp_host ? opts->tcp_host : getenv("DLSLIME_HOST");
    slime_status_t st = tcp_listen(host, opts->tcp_port, &t->listen_fd, &t->port);
    if (st != SLIME_OK) {
        free(t);
        return st;
    }
    if (host && *host && strcmp(host, "0.0.0.0") != 0) {
        struct in_addr in;
        inet_pton(AF_INET, host, &in); /* tcp_listen checked it */
        t->hosts[0] = in.s_addr;
        t->n_hosts = 1;
    } else {
        t->n_hosts = (uint16_t)list_hosts(t->hosts);
        if (t->n_hosts == 0) { t->hosts[0] = htonl(INADDR_LOOPBACK); t->n_hosts = 1; }
    }
    *state = t;
    return SLIME_OK;
}

static void tcp_ctx_close(void *state) {
    tcp_ctx_t *t = state;
    close(t->listen_fd);
    free(t);
}

static void tcp_address(const void *state, wire_addr_t *a) {
    const tcp_ctx_t *t = state;
    a->flags |= ADDR_HAS_TCP;
    a->port = t->port;
    a->n_hosts = t->n_hosts;
    memcpy(a->hosts, t->hosts, sizeof a->hosts);
}

static int tcp_reach(const slime_ctx_t *ctx, const void *state, const wire_addr_t *peer) {
    (void)ctx;
    (void)state;
    return (peer->flags & ADDR_HAS_TCP) && peer->n_hosts ? TP_REACH_NETWORK : TP_REACH_NONE;
}

static int tcp_listen_fd(const void *state) { return ((const tcp_ctx_t *)state)->listen_fd; }

static bool tcp_accept(slime_ctx_t *ctx, void *state) {
    return sock_accept_pending(ctx, tcp_listen_fd(state), WIRE_TRANSPORT_TCP, sock_tune_tcp);
}

static slime_status_t dial_one(slime_ctx_t *ctx, const wire_addr_t *peer, uint32_t host, uint64_t deadline,
                               int *fd_out, wire_welcome_t *w) {
    int fd;
    slime_status_t st = sock_connect_tcp("tcp", host, peer->port, deadline, &fd);
    if (st != SLIME_OK) return st;
    wire_hello_t h;
    hello_fill(ctx, peer, WIRE_TRANSPORT_TCP, &h);
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
        st = dial_one(ctx, peer, order[i], sock_try_deadline(deadline, i, n), fd, w);
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

/* Receives into dst (n bytes at most): bytes received, 0 if none now, or
 * the endpoint failed (negative).  After a receive that emptied the
 * socket the next one is skipped: it would almost always say EAGAIN, a
 * syscall (1-2 us here) on the way of every small message, and epoll
 * (level-triggered) keeps reporting the socket while bytes wait, so the
 * next look reads them. */
static ssize_t tcp_recv(slime_ep_t *ep, void *dst, size_t n) {
    tcp_conn_t *c = ep->conn;
    if (c->drained) {
        c->drained = false;
        return 0;
    }
    ssize_t r = recv(c->fd, dst, n, MSG_DONTWAIT);
    if (r > 0) {
        c->drained = (size_t)r < n;
        return r;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return broken(ep, "receive", r < 0 ? errno : 0);
}

/* The staged bytes not yet read, refilling an empty stage with up to
 * fill bytes from the socket: how many (0 if none now, negative if the
 * endpoint failed). */
static ssize_t stage_fill(slime_ep_t *ep, size_t fill) {
    tcp_conn_t *c = ep->conn;
    if (c->stage_off == c->stage_len) {
        ssize_t r = tcp_recv(ep, c->stage, fill);
        if (r <= 0) return r;
        c->stage_off = 0;
        c->stage_len = (size_t)r;
    }
    return (ssize_t)(c->stage_len - c->stage_off);
}

static ssize_t tcp_read(slime_ep_t *ep, void *dst, size_t n) {
    tcp_conn_t *c = ep->conn;
    /* big reads go straight to their destination */
    if (c->stage_off == c->stage_len && n >= STAGE_READ / 2) return tcp_recv(ep, dst, n);
    ssize_t have = stage_fill(ep, STAGE_READ);
    if (have <= 0) return have;
    size_t k = min_sz(n, (size_t)have);
    memcpy(dst, c->stage + c->stage_off, k);
    c->stage_off += k;
    return (ssize_t)k;
}

/* A combining receive folds the staged bytes where they lie: one copy
 * fewer than reading them out first. */
static size_t tcp_rx_peek(slime_ep_t *ep, size_t n, const uint8_t **at) {
    ssize_t have = stage_fill(ep, STAGE_SIZE);
    if (have <= 0) return 0; /* a failed endpoint's conn is gone */
    tcp_conn_t *c = ep->conn;
    *at = c->stage + c->stage_off;
    return min_sz(n, (size_t)have);
}

static void tcp_rx_consume(slime_ep_t *ep, size_t k) {
    tcp_conn_t *c = ep->conn;
    c->stage_off += k;
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

/* The sender's half of a rendezvous by CMA: the RTS says where its
 * bytes are.  Nothing to release: the send completes when the receiver
 * says it fetched them (F_RNDV_DONE) or asks for them (F_CTS). */
static void tcp_rndv_offer(slime_ep_t *ep, slime_req_t *send, frame_t *rts) {
    tcp_conn_t *c = ep->conn;
    if (!tcp_cma_usable(&c->cma, c->fd, ep->peer_pid, send->len)) return;
    rts->flags |= FF_RDMA;
    rts->d = (uint64_t)(uintptr_t)send->buf;
    rts->rkey = 0;
}

/* The receiver's half: copied whole here, or, should the kernel refuse
 * any of it, left to a plain CTS (the stream then rewrites every byte),
 * and this connection's rendezvous go by the stream from now on. */
static slime_status_t tcp_rndv_fetch(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq, uint64_t raddr,
                                     uint32_t rkey, uint64_t len) {
    (void)rkey;
    tcp_conn_t *c = ep->conn;
    if (!tcp_cma_usable(&c->cma, c->fd, ep->peer_pid, len)) return SLIME_ERR_UNSUPPORTED;
    if (!cma_fetch(ep->ctx, ep->peer_pid, recv->buf, raddr, len)) {
        c->cma.state = TCP_CMA_OFF;
        return SLIME_ERR_UNSUPPORTED;
    }
    tcp_ctx_t *t = ctx_tp_state(ep->ctx, WIRE_TRANSPORT_TCP);
    atomic_fetch_add(&t->cma_fetches, 1);
    req_complete(recv, SLIME_OK, NULL);
    proto_rndv_done(ep, sreq, SLIME_OK);
    return SLIME_OK;
}

static uint64_t tcp_counter(const void *state, slime_counter_t which) {
    const tcp_ctx_t *t = state;
    return which == SLIME_COUNTER_TCP_CMA_FETCHES ? atomic_load(&t->cma_fetches) : 0;
}

static bool tcp_peer_local(const void *conn) { return ((const tcp_conn_t *)conn)->same_host; }

static void tcp_close(slime_ep_t *ep) {
    tcp_conn_t *c = ep->conn;
    if (!c) return;
    close(c->fd);
    free(c);
    ep->conn = NULL;
}

const transport_ops_t slime_tcp_transport = {
    .size = sizeof(transport_ops_t),
    .name = "tcp",
    .wire = WIRE_TRANSPORT_TCP,
    .caps = TP_CAP_WRITE_EVENTS,
    .eager_env = "DLSLIME_EAGER_TCP",
    .eager_default = 256 * 1024,
    .absent = "has no tcp listener",
    .ctx_open = tcp_ctx_open,
    .ctx_close = tcp_ctx_close,
    .address = tcp_address,
    .reach = tcp_reach,
    .listen_fd = tcp_listen_fd,
    .accept = tcp_accept,
    .counter = tcp_counter,
    .dial = tcp_dial,
    .read_hello = tcp_read_hello,
    .send_welcome = tcp_send_welcome,
    .read = tcp_read,
    .writev = tcp_writev,
    .rx_ready = tcp_rx_ready,
    .fd_event = tcp_fd_event,
    .rma = NULL,
    .close = tcp_close,
    .rx_peek = tcp_rx_peek,
    .rx_consume = tcp_rx_consume,
    .rndv_offer = tcp_rndv_offer,
    .peer_local = tcp_peer_local,
    .rndv_fetch = tcp_rndv_fetch,
};
