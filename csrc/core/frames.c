/* The frames every transport carries over its byte stream: a queue of
 * outgoing frames written with gather I/O, and an incoming state machine
 * that reads a header, asks the protocol where the payload goes, and
 * lands it there directly. */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "core/internal.h"
#include "transport/transport.h"

#define TX_IOV 64
#define RX_BUDGET (8u << 20)

txn_t *txn_new(uint8_t type, size_t textlen) {
    txn_t *t = calloc(1, sizeof *t + textlen);
    if (t) {
        t->hdr.type = type;
        list_init(&t->link);
    }
    return t;
}

frame_t frame_eager(uint64_t tag, uint64_t len) {
    if (len > UINT32_MAX) return (frame_t){.type = F_EAGER, .a = tag, .len = len};
    return (frame_t){.type = F_EAGER, .flags = FF_SHORT, .u32 = (uint32_t)len, .a = tag, .len = len};
}

size_t frame_wire_size(const frame_t *h) { return h->flags & FF_SHORT ? FRAME_SHORT : sizeof *h; }

void frames_queue(slime_ep_t *ep, txn_t *t) { list_push_back(&ep->txq, &t->link); }

static void tx_done(slime_ep_t *ep, txn_t *t) {
    list_del(&t->link);
    if (t->release_handle) mr_own_release(ep->ctx, t->release_handle - 1);
    if (t->held) ep_unhold(ep);
    if (t->req) req_complete(t->req, SLIME_OK, NULL);
    if (t->hdr.type == F_PING) ep->ping_queued = false;
    free(t);
}

/* Watches for write-readiness while frames wait, for a transport whose
 * writes stop on a full socket (others ring doorbells or complete). */
static void arm_out(slime_ep_t *ep) {
    if (!(ep->tp->caps & TP_CAP_WRITE_EVENTS)) return;
    bool want = !list_empty(&ep->txq);
    if (want == ep->want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0), .data.ptr = ep->pollable};
    epoll_ctl(ep->ctx->epfd, EPOLL_CTL_MOD, ep->fd, &ev);
    ep->want_out = want;
}

/* The transport's writev of frames, the first of them req's (NULL: a
 * frame no request sends): its send options go along (ep->tx_coarse). */
static ssize_t write_frames(slime_ep_t *ep, const struct iovec *iov, int n, const slime_req_t *req) {
    ep->tx_coarse = req && req->coarse;
    return ep->tp->writev(ep, iov, n);
}

int frames_flush(slime_ep_t *ep) {
    size_t moved = 0;
    while (ep->state == EP_UP && !list_empty(&ep->txq)) {
        struct iovec iov[TX_IOV];
        int n = 0;
        size_t want = 0;
        slime_list_t *pos;
        for (pos = ep->txq.next; pos != &ep->txq && n + 2 <= TX_IOV; pos = pos->next) {
            txn_t *t = container_of(pos, txn_t, link);
            size_t hs = frame_wire_size(&t->hdr);
            if (t->sent < hs) {
                iov[n].iov_base = (uint8_t *)&t->hdr + t->sent;
                iov[n].iov_len = hs - t->sent;
                want += iov[n++].iov_len;
            }
            size_t poff = t->sent > hs ? t->sent - hs : 0;
            if (t->hdr.len > poff) {
                iov[n].iov_base = (uint8_t *)t->payload + poff;
                iov[n].iov_len = t->hdr.len - poff;
                want += iov[n++].iov_len;
            }
        }
        ssize_t w = write_frames(ep, iov, n, container_of(ep->txq.next, txn_t, link)->req);
        if (w < 0) return 1; /* the endpoint failed; its queue is gone */
        if (w == 0) break;
        moved += (size_t)w;
        size_t left = (size_t)w;
        while (left && !list_empty(&ep->txq)) {
            txn_t *t = container_of(ep->txq.next, txn_t, link);
            size_t total = frame_wire_size(&t->hdr) + t->hdr.len, k = min_sz(left, total - t->sent);
            t->sent += k;
            left -= k;
            if (t->sent == total) tx_done(ep, t);
        }
        /* zero-length payload frames finish with their header */
        while (!list_empty(&ep->txq)) {
            txn_t *t = container_of(ep->txq.next, txn_t, link);
            if (t->sent != frame_wire_size(&t->hdr) + t->hdr.len) break;
            tx_done(ep, t);
        }
        if ((size_t)w < want) break;
    }
    if (ep->state == EP_UP) arm_out(ep);
    /* bytes ahead of our ping moved: the peer is reading (liveness.c) */
    if (moved && ep->ping_queued) ep->heard++;
    return moved > 0;
}

int frames_send_now(slime_ep_t *ep, const slime_req_t *req, const frame_t *hdr, const void *payload, size_t *sent) {
    size_t hs = frame_wire_size(hdr);
    struct iovec iov[2] = {{(void *)hdr, hs}, {(void *)payload, hdr->len}};
    ssize_t w = write_frames(ep, iov, hdr->len ? 2 : 1, req);
    if (w < 0) return -1;
    *sent = (size_t)w;
    return *sent == hs + hdr->len;
}

static void rx_reset(rx_ctx_t *rx) {
    rx->state = RX_HDR;
    rx->hdr_got = 0;
    rx->sink = SINK_DISCARD;
    rx->dst = NULL;
    rx->left = rx->got = 0;
    rx->req = NULL;
    rx->umsg = NULL;
    rx->status = SLIME_OK;
    rx->text[0] = 0;
}

static int rx_frames(slime_ep_t *ep);

/* A header read whole: known, and in its long form (the short one's
 * length moved to len, its other fields zero), or the endpoint failed. */
static bool frame_expand(slime_ep_t *ep, frame_t *h) {
    if (h->type == 0 || h->type >= F_TYPE_MAX) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "peer sent an unknown frame type %u", h->type);
        return false;
    }
    if (!(h->flags & FF_SHORT)) return true;
    if (h->type != F_EAGER) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "peer sent a short frame of type %u", h->type);
        return false;
    }
    uint64_t len = h->u32;
    memset((uint8_t *)h + FRAME_SHORT, 0, sizeof *h - FRAME_SHORT);
    h->flags &= (uint8_t)~FF_SHORT;
    h->u32 = 0;
    h->len = len;
    return true;
}

int frames_rx(slime_ep_t *ep) {
    int did = rx_frames(ep);
    ep->heard += (unsigned)did; /* liveness.c */
    return did;
}

static int rx_frames(slime_ep_t *ep) {
    rx_ctx_t *rx = &ep->rx;
    size_t moved = 0;
    uint8_t scratch[16384];
    while (ep->state == EP_UP && moved < RX_BUDGET) {
        if (rx->paused) {
            proto_on_header(ep); /* retry: is there room now? */
            if (rx->paused || ep->state != EP_UP) break;
        } else if (rx->state == RX_HDR) {
            /* the short form first: its flags say whether more follows */
            size_t need = rx->hdr_got < FRAME_SHORT ? FRAME_SHORT : sizeof rx->hdr;
            ssize_t n = ep->tp->read(ep, (uint8_t *)&rx->hdr + rx->hdr_got, need - rx->hdr_got);
            if (n <= 0) break;
            moved += (size_t)n;
            rx->hdr_got += (size_t)n;
            if (rx->hdr_got < need || (need == FRAME_SHORT && !(rx->hdr.flags & FF_SHORT))) continue;
            if (!frame_expand(ep, &rx->hdr)) break;
            rx->state = RX_PAYLOAD;
            rx->left = rx->hdr.len;
            rx->got = 0;
            proto_on_header(ep);
            /* counted on arrival only: the paused branch above retries */
            if (rx->parked) atomic_fetch_add_explicit(&ep->ctx->parks, 1, memory_order_relaxed);
            if (rx->paused || ep->state != EP_UP) break;
        }
        bool combine = rx->sink == SINK_RECV && rx->req->combine;
        while (rx->left) {
            /* a long payload yields too (rx keeps its place): a peer
             * that keeps bytes coming must not hold ctx->lock for ever */
            if (moved >= RX_BUDGET) return 1;
            uint8_t *dst = rx->sink == SINK_DISCARD ? scratch : rx->dst + rx->got;
            size_t want = rx->sink == SINK_DISCARD ? min_sz(rx->left, sizeof scratch) : rx->left;
            ssize_t n = combine ? frames_rx_combine(ep) : ep->tp->read(ep, dst, want);
            if (n < 0) return 1;
            if (n == 0) return moved > 0;
            moved += (size_t)n;
            rx->got += (size_t)n;
            rx->left -= (size_t)n;
        }
        proto_on_payload(ep);
        if (ep->state != EP_UP) break;
        rx_reset(rx);
        moved++; /* a zero-length frame is progress too */
    }
    return moved > 0;
}
