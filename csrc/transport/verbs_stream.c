/* The frame stream over RC SEND/RECV, and the completion queue.
 *
 * writev copies the core's frames into registered send slots (a slot not
 * yet posted takes more bytes); each slot goes out as one SEND_WITH_IMM
 * into one of the receives the peer pre-posted.  read copies them out of
 * received slots in order and posts each slot again once it is empty.
 *
 * Credits: we may send only while the peer has a receive posted for it.
 * `credits` counts those; every SEND we make (and every WRITE_WITH_IMM,
 * which consumes a receive too) spends one; the low 24 bits of each
 * SEND's immediate hand back the receives we reposted since our last
 * SEND.  Data and control messages keep one credit in reserve for a
 * credit-only message, sent when half the peer's receives wait to be
 * handed back: whenever one side starves, the other holds at least
 * recv_slots - 1 unreturned receives and still has its reserve, so the
 * two can never wait on each other, and no SEND ever meets an empty
 * receive queue (no receiver-not-ready retries).
 *
 * Completions: the CQ is polled by whoever progresses the context (a
 * spinning waiter or the progress thread).  Before the progress thread
 * sleeps, the CQ is armed and polled once more, so a completion either
 * was seen or wakes it through the completion channel. */
#ifdef SLIME_HAVE_VERBS

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/verbs_internal.h"

typedef struct ctrl_msg {
    slime_list_t link;
    size_t len;
    uint8_t data[];
} ctrl_msg_t;

void vconn_fail(slime_ep_t *ep, const char *fmt, ...) {
    char text[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ep_fail(ep, SLIME_ERR_PEER_LOST, "verbs: %s", text);
}

static verbs_conn_t *conn_of(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    c->ep = ep;
    return c;
}

static uint32_t return_threshold(const verbs_conn_t *c) {
    uint32_t t = c->dev->recv_slots / 2;
    return t ? t : 1;
}

static uint32_t take_returns(verbs_conn_t *c) {
    uint32_t k = c->to_return > VMSG_CREDIT_MASK ? VMSG_CREDIT_MASK : c->to_return;
    c->to_return -= k;
    return k;
}

static bool post_send(slime_ep_t *ep, struct ibv_send_wr *wr) {
    verbs_conn_t *c = ep->conn;
    struct ibv_send_wr *bad;
    vconn_will_post(c);
    int e = ibv_post_send(c->qp[0], wr, &bad);
    if (e) {
        vconn_fail(ep, "ibv_post_send on QP 0: %s", strerror(e));
        return false;
    }
    c->sq_used++;
    return true;
}

static bool repost(slime_ep_t *ep, vslot_t *s) {
    verbs_conn_t *c = ep->conn;
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = c->dev->slot_size, .lkey = c->mem_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uintptr_t)s, .sg_list = &sge, .num_sge = 1}, *bad;
    int e = ibv_post_recv(c->qp[0], &wr, &bad);
    if (e) {
        vconn_fail(ep, "ibv_post_recv: %s", strerror(e));
        return false;
    }
    s->posted = true;
    c->to_return++;
    return true;
}

/* Sends ready slots while credits last, one kept in reserve. */
static bool post_ready(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    if (!c->peer_ready) return true;
    while (!list_empty(&c->tx_ready) && c->credits >= 2 && c->sq_used < c->sq_cap) {
        vslot_t *s = container_of(c->tx_ready.next, vslot_t, link);
        list_del(&s->link);
        struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = s->len, .lkey = c->mem_mr->lkey};
        struct ibv_send_wr wr = {
            .wr_id = (uintptr_t)s,
            .sg_list = &sge,
            .num_sge = 1,
            .opcode = IBV_WR_SEND_WITH_IMM,
            .send_flags = IBV_SEND_SIGNALED,
            .imm_data = htonl((uint32_t)s->msg << 24 | take_returns(c)),
        };
        s->posted = true;
        c->credits--;
        if (!post_send(ep, &wr)) return false;
    }
    return true;
}

static bool return_credits(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    if (!c->peer_ready || c->to_return < return_threshold(c) || c->credits < 1 || c->sq_used >= c->sq_cap) return true;
    struct ibv_send_wr wr = {
        .wr_id = (uintptr_t)&c->credit_wr,
        .opcode = IBV_WR_SEND_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl((uint32_t)VMSG_CREDIT << 24 | take_returns(c)),
    };
    c->credits--;
    return post_send(ep, &wr);
}

/* Control messages go one per slot, in order. */
static void ctrl_to_slots(verbs_conn_t *c) {
    while (!list_empty(&c->ctrl_backlog) && !list_empty(&c->tx_free)) {
        ctrl_msg_t *m = container_of(c->ctrl_backlog.next, ctrl_msg_t, link);
        vslot_t *s = container_of(c->tx_free.next, vslot_t, link);
        list_del(&m->link);
        list_del(&s->link);
        memcpy(s->buf, m->data, m->len);
        s->len = (uint32_t)m->len;
        s->msg = VMSG_CTRL;
        list_push_back(&c->tx_ready, &s->link);
        free(m);
    }
}

bool vconn_send_ctrl(slime_ep_t *ep, const void *msg, size_t len) {
    verbs_conn_t *c = ep->conn;
    ctrl_msg_t *m = malloc(sizeof *m + len);
    if (!m) {
        ep_fail(ep, SLIME_ERR_NOMEM, "verbs: out of memory for a control message");
        return false;
    }
    m->len = len;
    memcpy(m->data, msg, len);
    list_push_back(&c->ctrl_backlog, &m->link);
    ctrl_to_slots(c);
    return post_ready(ep);
}

void vconn_ctrl_free(verbs_conn_t *c) {
    while (!list_empty(&c->ctrl_backlog)) {
        ctrl_msg_t *m = container_of(c->ctrl_backlog.next, ctrl_msg_t, link);
        list_del(&m->link);
        free(m);
    }
}

bool vconn_kick(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    ctrl_to_slots(c);
    if (!post_ready(ep) || !vops_post(ep) || !return_credits(ep)) return false;
    /* frames the core could not hand us for want of a free slot */
    if (!list_empty(&ep->txq) && !list_empty(&c->tx_free)) frames_flush(ep);
    return ep->state == EP_UP;
}

ssize_t verbs_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    verbs_conn_t *c = conn_of(ep);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            vslot_t *s = list_empty(&c->tx_ready) ? NULL : container_of(c->tx_ready.prev, vslot_t, link);
            if (!s || s->msg != VMSG_STREAM || s->len == c->tx_size) {
                if (list_empty(&c->tx_free)) goto out;
                s = container_of(c->tx_free.next, vslot_t, link);
                list_del(&s->link);
                s->msg = VMSG_STREAM;
                s->len = 0;
                list_push_back(&c->tx_ready, &s->link);
            }
            size_t k = min_sz(left, c->tx_size - s->len);
            memcpy(s->buf + s->len, p, k);
            s->len += (uint32_t)k;
            p += k;
            left -= k;
            total += k;
        }
    }
out:
    if (!post_ready(ep)) return SLIME_ERR_PEER_LOST;
    return (ssize_t)total;
}

ssize_t verbs_read(slime_ep_t *ep, void *dst, size_t n) {
    verbs_conn_t *c = conn_of(ep);
    size_t got = 0;
    while (got < n && !list_empty(&c->rx_got)) {
        vslot_t *s = container_of(c->rx_got.next, vslot_t, link);
        size_t k = min_sz(n - got, s->len - s->off);
        memcpy((uint8_t *)dst + got, s->buf + s->off, k);
        s->off += (uint32_t)k;
        got += k;
        if (s->off == s->len) {
            list_del(&s->link);
            if (!repost(ep, s)) return SLIME_ERR_PEER_LOST;
        }
    }
    if (c->to_return >= return_threshold(c) && (!post_ready(ep) || !return_credits(ep))) return SLIME_ERR_PEER_LOST;
    return (ssize_t)got;
}

static bool on_recv(slime_ep_t *ep, vslot_t *s, const struct ibv_wc *wc) {
    verbs_conn_t *c = ep->conn;
    s->posted = false;
    c->peer_ready = true; /* its QPs sent this, so they are up */
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        /* a peer's write_imm: its data is in place, the receive only
         * carried the immediate */
        if (!repost(ep, s)) return false;
        proto_deliver_imm(ep, ntohl(wc->imm_data));
        return ep->state == EP_UP;
    }
    if (!(wc->wc_flags & IBV_WC_WITH_IMM)) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: peer sent a message without its header");
        return false;
    }
    uint32_t imm = ntohl(wc->imm_data);
    c->credits += imm & VMSG_CREDIT_MASK;
    switch (imm >> 24) {
    case VMSG_STREAM:
        s->len = wc->byte_len;
        s->off = 0;
        if (s->len == 0) return repost(ep, s);
        list_push_back(&c->rx_got, &s->link);
        return true;
    case VMSG_CTRL: {
        uint8_t msg[256];
        size_t len = min_sz(wc->byte_len, sizeof msg);
        memcpy(msg, s->buf, len);
        return repost(ep, s) && rkeys_on_ctrl(ep, msg, len);
    }
    case VMSG_CREDIT:
        return repost(ep, s);
    }
    ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: peer sent a message of unknown kind %u", imm >> 24);
    return false;
}

static int qp_index(const verbs_conn_t *c, uint32_t qp_num) {
    for (int i = 0; i < c->n_qps; i++)
        if (c->qp[i]->qp_num == qp_num) return i;
    return 0;
}

static const char *wr_what(uint8_t kind) {
    switch (kind) {
    case VW_RECV: return "a receive";
    case VW_SEND: return "a send";
    case VW_CREDIT: return "a credit message";
    case VW_OP: return "an RDMA read/write";
    }
    return "a work request";
}

/* A failed completion breaks the endpoint.  Flushes follow the error
 * that broke a QP, and the QPs share the CQ: report the real error if it
 * is still in the queue (the conn is going away; nothing else is lost). */
static void fail_on(slime_ep_t *ep, const struct ibv_wc *wcs, int i, int n) {
    verbs_conn_t *c = ep->conn;
    struct ibv_wc wc = wcs[i], more[32];
    for (int j = i + 1; j < n && wc.status == IBV_WC_WR_FLUSH_ERR; j++)
        if (wcs[j].status != IBV_WC_SUCCESS) wc = wcs[j];
    for (int round = 0; round < 64 && wc.status == IBV_WC_WR_FLUSH_ERR; round++) {
        int k = ibv_poll_cq(c->cq, 32, more);
        if (k <= 0) break;
        for (int j = 0; j < k && wc.status == IBV_WC_WR_FLUSH_ERR; j++)
            if (more[j].status != IBV_WC_SUCCESS) wc = more[j];
    }
    uint8_t kind = *(const uint8_t *)(uintptr_t)wc.wr_id;
    const char *async = wc.status == IBV_WC_WR_FLUSH_ERR ? verbs_async_why(c) : NULL;
    vconn_fail(ep, "work completion error on %s (QP %d): %s (status %d)%s%s", wr_what(kind),
               qp_index(c, wc.qp_num), verbs_api.wc_status_str(wc.status), (int)wc.status,
               async ? "; the device reported: " : "", async ? async : "");
}

static bool handle_wc(slime_ep_t *ep, const struct ibv_wc *wcs, int i, int n) {
    verbs_conn_t *c = ep->conn;
    const struct ibv_wc *wc = &wcs[i];
    uint8_t kind = *(const uint8_t *)(uintptr_t)wc->wr_id;
    if (wc->status != IBV_WC_SUCCESS) {
        fail_on(ep, wcs, i, n);
        return false;
    }
    switch (kind) {
    case VW_RECV:
        return on_recv(ep, (vslot_t *)(uintptr_t)wc->wr_id, wc);
    case VW_SEND: {
        vslot_t *s = (vslot_t *)(uintptr_t)wc->wr_id;
        c->sq_used--;
        s->posted = false;
        list_push_back(&c->tx_free, &s->link);
        return true;
    }
    case VW_CREDIT:
        c->sq_used--;
        return true;
    case VW_OP:
        c->rd_used[qp_index(c, wc->qp_num)]--;
        return vop_completed(ep, (vop_t *)(uintptr_t)wc->wr_id);
    }
    ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: completion of an unknown work request");
    return false;
}

bool vconn_poll(slime_ep_t *ep) {
    verbs_conn_t *c = conn_of(ep);
    struct ibv_wc wc[32];
    for (;;) {
        int n = ibv_poll_cq(c->cq, 32, wc);
        if (n < 0) {
            vconn_fail(ep, "ibv_poll_cq failed");
            return false;
        }
        if (n > 0) c->quiet_since_ns = now_ns();
        for (int i = 0; i < n; i++)
            if (!handle_wc(ep, wc, i, n)) return false; /* the conn is gone */
        if (n < 32) break;
    }
    return vconn_kick(ep);
}

bool verbs_rx_ready(slime_ep_t *ep) {
    verbs_conn_t *c = conn_of(ep);
    if (!vconn_poll(ep) || !vconn_watch(ep)) return false;
    if (!list_empty(&c->rx_got)) return true;
    /* nobody spins on this context: the progress thread may sleep next,
     * so have the channel wake it, and look once more for what came
     * before the arming (a spinning waiter polls; no wake-ups for it) */
    if (!c->armed && atomic_load(&c->ctx->spinners) == 0) {
        if (ibv_req_notify_cq(c->cq, 0) == 0) c->armed = true;
        if (!vconn_poll(ep)) return false;
    }
    return !list_empty(&c->rx_got);
}

void verbs_fd_event(slime_ep_t *ep, uint32_t events) {
    (void)events; /* those of the inner epoll set, asked below */
    verbs_conn_t *c = conn_of(ep);
    struct epoll_event ev[2];
    int n = epoll_wait(c->epfd, ev, 2, 0);
    bool hup = false;
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u32 == 2) {
            struct ibv_cq *cq;
            void *cq_ctx;
            while (verbs_api.get_cq_event(c->ch, &cq, &cq_ctx) == 0) {
                verbs_api.ack_cq_events(cq, 1);
                c->armed = false;
            }
        } else {
            char buf[64];
            ssize_t r = recv(c->sock, buf, sizeof buf, MSG_DONTWAIT);
            if (r > 0) c->peer_ready = true; /* the dialer's ready byte */
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
                (ev[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)))
                hup = true;
        }
    }
    if (!vconn_poll(ep)) return;
    /* what the peer sent before it died is still worth reading */
    if (hup && (list_empty(&c->rx_got) || ep->rx.paused))
        ep_fail(ep, SLIME_ERR_PEER_LOST, "peer closed the connection (its verbs liveness socket hung up)");
}

bool verbs_tx_unsent(slime_ep_t *ep) {
    verbs_conn_t *c = conn_of(ep);
    return c->sq_used || !list_empty(&c->tx_ready) || !list_empty(&c->ctrl_backlog);
}

void verbs_close_ep(slime_ep_t *ep) {
    vconn_free(ep->conn);
    ep->conn = NULL;
}

#else
typedef int verbs_stream_unused;
#endif
