/* How a verbs endpoint comes up.  The dialer connects to the peer's tcp
 * listener and sends the usual hello (transport = verbs, job token proof)
 * followed by its QP info (QP numbers, PSNs, GID, MTU, slots); the
 * acceptor checks the hello as for any transport, brings its QPs to RTS
 * against that info, and answers with the welcome followed by its own
 * info; the dialer then brings its QPs up too and sends one ready byte,
 * until which the acceptor posts nothing (see verbs_conn.peer_ready).
 *
 * The socket stays open for the life of the endpoint, as a liveness line:
 * when a peer process dies, the kernel closes it at once, whereas its
 * queue pairs would only show the loss once a retry timer ran out, and
 * only if something was in flight.  It carries nothing else after the
 * ready byte. */
#ifdef SLIME_HAVE_VERBS

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/sockio.h"
#include "transport/verbs_internal.h"

/* The hello + our info on a connected socket, then the welcome. */
static slime_status_t greet(slime_ctx_t *ctx, const wire_addr_t *peer, int fd, const wire_verbs_info_t *mine,
                            uint64_t deadline, wire_welcome_t *w) {
    wire_hello_t h;
    hello_fill(ctx, peer, WIRE_TRANSPORT_VERBS, &h);
    struct iovec iov[2] = {{.iov_base = &h, .iov_len = sizeof h},
                           {.iov_base = (void *)mine, .iov_len = sizeof *mine}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    slime_status_t st = sock_sendmsg_all(fd, &msg, deadline);
    if (st == SLIME_OK) st = sock_recv_all(fd, w, sizeof *w, deadline);
    return st;
}

/* Our QPs are up: the acceptor, which holds its first posts until now,
 * may send. */
static slime_status_t say_ready(int fd, uint64_t deadline) {
    char ready = 'R';
    struct iovec iov = {.iov_base = &ready, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    return sock_sendmsg_all(fd, &msg, deadline);
}

slime_status_t verbs_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline, void **conn, int *fd_out,
                          wire_welcome_t *w) {
    *conn = NULL;
    *fd_out = -1;
    verbs_conn_t *c;
    slime_status_t st = vconn_new(ctx, verbs_dev_of(ctx)->n_qps, &c);
    if (st != SLIME_OK) return st;
    wire_verbs_info_t mine, theirs;
    vconn_info(c, &mine);
    uint32_t order[WIRE_MAX_HOSTS + 1];
    int n = sock_peer_hosts(ctx, peer, order);
    st = slime_errorf(SLIME_ERR_PEER_LOST, "verbs: no address of the peer answered");
    int fd = -1;
    for (int i = 0; i < n && now_ns() < deadline; i++) {
        uint64_t until = sock_try_deadline(deadline, i, n);
        st = sock_connect_tcp("verbs: tcp", order[i], peer->port, until, &fd);
        if (st == SLIME_OK && (st = greet(ctx, peer, fd, &mine, until, w)) != SLIME_OK) {
            close(fd);
            fd = -1;
        }
        if (st == SLIME_OK) break;
    }
    if (st != SLIME_OK) goto fail;
    if (w->magic != WIRE_WELCOME_MAGIC || w->verdict != WELCOME_OK) {
        /* refused or duplicate: the caller reads the verdict */
        close(fd);
        vconn_free(c);
        return SLIME_OK;
    }
    char why[128];
    if ((st = sock_recv_all(fd, &theirs, sizeof theirs, deadline)) != SLIME_OK) goto fail;
    if (!verbs_info_valid(&theirs, why, sizeof why)) {
        st = slime_errorf(SLIME_ERR_PROTOCOL, "%s", why);
        goto fail;
    }
    if ((st = vconn_connect(c, &theirs)) != SLIME_OK) goto fail;
    if ((st = say_ready(fd, deadline)) != SLIME_OK) goto fail;
    c->peer_ready = true;
    int epfd = vconn_set_socket(c, fd);
    if (epfd < 0) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "verbs: epoll: %s", strerror(errno));
        goto fail;
    }
    *conn = c;
    *fd_out = epfd;
    return SLIME_OK;
fail:
    if (fd >= 0) close(fd);
    vconn_free(c);
    return st;
}

/* The hello is in (read by tcp); the QP info follows it. */
int verbs_read_hello(slime_ctx_t *ctx, pending_conn_t *pc) {
    (void)ctx;
    const size_t need = sizeof(wire_verbs_info_t);
    while (pc->extra_got < need) {
        ssize_t r = recv(pc->fd, pc->extra + pc->extra_got, need - pc->extra_got, 0);
        if (r == 0) return -1;
        if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        pc->extra_got += (size_t)r;
    }
    char why[128];
    wire_verbs_info_t in;
    memcpy(&in, pc->extra, sizeof in);
    return verbs_info_valid(&in, why, sizeof why) ? 1 : -1;
}

static slime_status_t send_all_now(int fd, const struct iovec *iov, int n) {
    /* a fresh socket's send buffer always has room for the handshake */
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    size_t want = 0;
    for (int i = 0; i < n; i++) want += iov[i].iov_len;
    ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    return r == (ssize_t)want ? SLIME_OK : slime_errorf(SLIME_ERR_PEER_LOST, "verbs: welcome not sent");
}

slime_status_t verbs_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc, const wire_welcome_t *w, void **conn) {
    struct iovec iov[2] = {{.iov_base = (void *)w, .iov_len = sizeof *w}};
    if (!conn) return send_all_now(pc->fd, iov, 1);
    wire_verbs_info_t theirs, mine;
    memcpy(&theirs, pc->extra, sizeof theirs);
    int mine_n = verbs_dev_of(ctx)->n_qps;
    int n = mine_n < theirs.n_qps ? mine_n : theirs.n_qps;
    verbs_conn_t *c;
    slime_status_t st = vconn_new(ctx, n, &c);
    if (st != SLIME_OK) return st;
    st = vconn_connect(c, &theirs);
    if (st == SLIME_OK) {
        vconn_info(c, &mine);
        iov[1] = (struct iovec){.iov_base = &mine, .iov_len = sizeof mine};
        st = send_all_now(pc->fd, iov, 2);
    }
    if (st == SLIME_OK && vconn_set_socket(c, pc->fd) < 0)
        st = slime_errorf(SLIME_ERR_SYSTEM, "verbs: epoll: %s", strerror(errno));
    if (st != SLIME_OK) {
        vconn_free(c);
        /* tell the dialer why (an unreachable GID, no memory to pin),
         * rather than only closing on it */
        wire_welcome_t no = *w;
        no.verdict = WELCOME_REFUSED;
        snprintf(no.reason, sizeof no.reason, "%s", slime_last_error());
        iov[0] = (struct iovec){.iov_base = &no, .iov_len = sizeof no};
        (void)send_all_now(pc->fd, iov, 1);
        return st;
    }
    *conn = c;
    return SLIME_OK;
}

int verbs_conn_fd(void *conn) { return ((verbs_conn_t *)conn)->epfd; }

bool verbs_peer_local(const void *conn) { return ((const verbs_conn_t *)conn)->same_host; }

void verbs_describe(void *conn, char *buf, size_t len) {
    snprintf(buf, len, "%s", ((verbs_conn_t *)conn)->desc);
}

#else
typedef int verbs_handshake_unused;
#endif
