/* The protocol spoken over a stream: tag matching (eager for small
 * messages, rendezvous for large ones so unexpected data never piles up),
 * and one-sided ops served by the target's progress engine after checking
 * its MR table.  Transports that can copy one-sided data themselves (shm
 * by CMA) take RMA requests through proto_rma_progress instead. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "transport/transport.h"

#define RMA_CHUNK (4u << 20)
/* One-sided ops up to this size are copied by the thread that posts them
 * (when nothing is queued before them): handing one to the progress
 * thread and its completion back costs two wake-ups, which on shm took as
 * long as copying 2 MiB (rdma_bench, heap tensors: 1 MiB 70 -> 57 us,
 * 256 KiB 20 -> 13 us).  Larger ones return at once and the progress
 * thread copies them, so the caller can overlap its own work. */
#define RMA_INLINE_MAX (2u << 20)
/* Eager payloads below this are copied out at once: a small copy costs
 * less than a progress pass's look at the parked frame. */
#define PARK_MIN 4096u

void umsg_free(slime_ctx_t *ctx, umsg_t *m) {
    list_del(&m->link);
    if (!m->rts) ctx->unexp_bytes -= m->len;
    ep_unhold(m->ep);
    ep_unref(m->ep);
    free(m->data);
    free(m);
}

static slime_req_t *match_posted(slime_ctx_t *ctx, slime_ep_t *ep, uint64_t tag) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->posted) {
        slime_req_t *r = container_of(pos, slime_req_t, qlink);
        if (r->tag == tag && (r->ep == NULL || r->ep == ep)) {
            list_del(&r->qlink);
            if (!r->ep) ep_ref(ep);
            r->ep = ep;
            if (!list_linked(&r->eplink)) list_push_back(&ep->pending, &r->eplink);
            return r;
        }
    }
    return NULL;
}

static void send_frame(slime_ep_t *ep, txn_t *t) {
    frames_queue(ep, t);
    frames_flush(ep);
}

/* A reply to the peer's request: an item held for it until it is sent
 * (budget.c), so a peer that never reads its replies cannot queue them
 * without bound; false when that put the peer over its budget. */
static bool reply_new(slime_ep_t *ep, uint8_t type, size_t textlen, txn_t **out) {
    *out = NULL;
    if (!ep_hold(ep, "replies it has not read")) return false;
    txn_t *t = txn_new(type, textlen);
    if (!t) {
        ep_unhold(ep);
        ep_fail(ep, SLIME_ERR_NOMEM, "out of memory for a reply frame");
        return false;
    }
    t->held = true;
    *out = t;
    return true;
}

static void send_status(slime_ep_t *ep, uint8_t type, uint64_t ireq, slime_status_t st, const char *text) {
    size_t tl = st == SLIME_OK ? 0 : strnlen(text, WIRE_ERRTEXT_MAX - 1);
    txn_t *t;
    if (!reply_new(ep, type, tl + 1, &t)) return;
    t->hdr.a = ireq;
    t->hdr.u32 = (uint32_t)(int32_t)st;
    memcpy(t->text, text ? text : "", tl);
    t->payload = t->text;
    t->hdr.len = tl;
    send_frame(ep, t);
}

void proto_send_cts(slime_ep_t *ep, uint64_t sreq, slime_req_t *recv, slime_status_t st) {
    txn_t *t = txn_new(F_CTS, 0);
    if (!t) { ep_fail(ep, SLIME_ERR_NOMEM, "out of memory for a CTS frame"); return; }
    t->hdr.a = sreq;
    t->hdr.b = recv ? recv->id : 0;
    t->hdr.u32 = (uint32_t)(int32_t)st;
    send_frame(ep, t);
}

void proto_rndv_done(slime_ep_t *ep, uint64_t sreq, slime_status_t st) {
    txn_t *t = txn_new(F_RNDV_DONE, 0);
    if (!t) { ep_fail(ep, SLIME_ERR_NOMEM, "out of memory for a rendezvous-done frame"); return; }
    t->hdr.a = sreq;
    t->hdr.u32 = (uint32_t)(int32_t)st;
    send_frame(ep, t);
}

/* What an RTS announced; rdma: the receiver may fetch it itself. */
typedef struct rts_info {
    uint64_t sreq, len, raddr;
    uint32_t rkey;
    bool rdma;
} rts_info_t;

/* A receive met a rendezvous announcement: fetch the data where the
 * transport can, else ask for it. */
static void rts_matched(slime_ep_t *ep, slime_req_t *r, const rts_info_t *in) {
    if (in->len > r->len || recv_misfit(r, in->len)) {
        proto_send_cts(ep, in->sreq, NULL, in->len > r->len ? SLIME_ERR_TRUNCATED : SLIME_ERR_INVAL);
        recv_refuse(r, in->len);
        return;
    }
    r->bytes = in->len;
    if (!list_linked(&r->eplink)) list_push_back(&ep->pending, &r->eplink);
    /* a fetch lands the bytes as they are: a combining receive takes
     * them by the stream, which folds them in (combine.c) */
    if (in->rdma && !r->combine && ep->tp->rndv_fetch &&
        ep->tp->rndv_fetch(ep, r, in->sreq, in->raddr, in->rkey, in->len) == SLIME_OK)
        return;
    if (!req_id_assign(ep->ctx, r)) { req_complete(r, SLIME_ERR_NOMEM, "out of request ids"); return; }
    proto_send_cts(ep, in->sreq, r, SLIME_OK);
}

bool proto_match_unexpected(slime_ctx_t *ctx, slime_req_t *req) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->unexpected) {
        umsg_t *m = container_of(pos, umsg_t, link);
        if (m->tag != req->tag || (req->ep && m->ep != req->ep)) continue;
        if (!req->ep) ep_ref(m->ep);
        req->ep = m->ep;
        if (m->rts) {
            slime_ep_t *ep = m->ep;
            rts_info_t in = {.sreq = m->sreq, .len = m->len, .raddr = m->raddr, .rkey = m->rkey, .rdma = m->rdma};
            umsg_free(ctx, m);
            rts_matched(ep, req, &in);
        } else if (m->len > req->len || recv_misfit(req, m->len)) {
            recv_refuse(req, m->len);
            umsg_free(ctx, m);
        } else {
            recv_deliver(req, m->data, m->len);
            req->bytes = m->len;
            umsg_free(ctx, m);
            req_complete(req, SLIME_OK, NULL);
        }
        return true;
    }
    return false;
}

size_t proto_drop_unexpected(slime_ctx_t *ctx, bool (*stale)(uint64_t tag, void *arg), void *arg) {
    size_t n = 0;
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->unexpected) {
        umsg_t *m = container_of(pos, umsg_t, link);
        if (!stale(m->tag, arg)) continue;
        /* an announced message's sender waits for an answer: refuse it,
         * so that its send fails now rather than at its timeout */
        if (m->rts && m->ep->state == EP_UP) proto_send_cts(m->ep, m->sreq, NULL, SLIME_ERR_CANCELED);
        umsg_free(ctx, m);
        n++;
    }
    return n;
}

void proto_deliver_imm(slime_ep_t *ep, uint32_t imm) {
    slime_req_t *w = list_first(&ep->imm_waiters, slime_req_t, qlink);
    if (w) {
        w->imm = imm;
        req_complete(w, SLIME_OK, NULL);
        return;
    }
    if (!ep_hold(ep, "immediates nobody took")) return;
    if (ep->imm_count == ep->imm_cap) {
        size_t cap = ep->imm_cap ? ep->imm_cap * 2 : 64;
        uint32_t *n = malloc(cap * sizeof *n);
        if (!n) {
            ep_unhold(ep);
            ep_fail(ep, SLIME_ERR_NOMEM, "out of memory queueing immediates");
            return;
        }
        for (size_t i = 0; i < ep->imm_count; i++) n[i] = ep->imms[(ep->imm_head + i) % ep->imm_cap];
        free(ep->imms);
        ep->imms = n;
        ep->imm_cap = cap;
        ep->imm_head = 0;
    }
    ep->imms[(ep->imm_head + ep->imm_count++) % ep->imm_cap] = imm;
}

static slime_req_t *lookup(slime_ep_t *ep, uint64_t id, enum req_kind kind, const char *what) {
    slime_req_t *r = req_id_lookup(ep->ctx, id);
    if (!r || r->ep != ep || r->kind != kind) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "peer answered a %s we do not have (id %" PRIx64 ")", what, id);
        return NULL;
    }
    return r;
}

static bool wire_status_ok(uint32_t v) {
    int32_t s = (int32_t)v;
    return s <= 0 && s >= SLIME_ERR_BUSY;
}

/* ---- one handler per frame type ----
 * A handler returns false for a malformed frame (proto_on_header fails
 * the endpoint, saying so), true when it took the frame, which includes
 * failing the endpoint itself for a reason of its own.  On entry the
 * payload sink is SINK_DISCARD: a handler that wants the payload points
 * rx at where it goes. */

static bool on_eager(slime_ep_t *ep, const frame_t *h) {
    slime_ctx_t *ctx = ep->ctx;
    rx_ctx_t *rx = &ep->rx;
    if (h->len > ctx->unexp_cap) return false; /* no sender of ours does that */
    slime_req_t *r = match_posted(ctx, ep, h->a);
    if (r) {
        rx->req = r;
        if (h->len > r->len || recv_misfit(r, h->len)) { rx->status = SLIME_ERR_TRUNCATED; return true; }
        rx->sink = SINK_RECV;
        rx->dst = r->buf;
        return true;
    }
    /* Left in a polled transport until its receive is posted, a payload
     * is copied once, straight out; read now, it would be copied into a
     * buffer of ours and out again (the receiver that comes late to a
     * collective).  Only while nothing waits behind it: a later message
     * may be the one a receive waits for. */
    if (h->len >= PARK_MIN && ep->tp->rx_beyond && !ep->tp->rx_beyond(ep, rx->left)) {
        rx->paused = true;
        proto_set_parked(ep, true);
        return true;
    }
    if (ctx->unexp_bytes && ctx->unexp_bytes + h->len > ctx->unexp_cap) { rx->paused = true; return true; }
    umsg_t *m = calloc(1, sizeof *m);
    void *data = h->len ? malloc(h->len) : NULL;
    if (!m || (h->len && !data)) {
        free(m);
        free(data);
        rx->paused = true; /* try again when memory frees up */
        return true;
    }
    if (!ep_hold(ep, "messages nobody received")) {
        free(m);
        free(data);
        return true;
    }
    m->ep = ep;
    ep_ref(ep);
    m->tag = h->a;
    m->len = h->len;
    m->data = data;
    list_init(&m->link);
    ctx->unexp_bytes += h->len;
    atomic_fetch_add_explicit(&ctx->unexp_copies, 1, memory_order_relaxed);
    rx->sink = SINK_UNEXP;
    rx->umsg = m;
    rx->dst = data;
    return true;
}

static bool on_rts(slime_ep_t *ep, const frame_t *h) {
    slime_ctx_t *ctx = ep->ctx;
    if (h->len) return false;
    rts_info_t in = {.sreq = h->b, .len = h->c, .raddr = h->d, .rkey = h->rkey, .rdma = (h->flags & FF_RDMA) != 0};
    slime_req_t *r = match_posted(ctx, ep, h->a);
    if (r) {
        rts_matched(ep, r, &in);
        return true;
    }
    umsg_t *u = calloc(1, sizeof *u);
    if (!u) { ep->rx.paused = true; return true; }
    if (!ep_hold(ep, "rendezvous announcements nobody received")) {
        free(u);
        return true;
    }
    u->ep = ep;
    ep_ref(ep);
    u->tag = h->a;
    u->len = h->c;
    u->rts = true;
    u->sreq = h->b;
    u->rdma = in.rdma;
    u->raddr = in.raddr;
    u->rkey = in.rkey;
    list_push_back(&ctx->unexpected, &u->link);
    return true;
}

/* The rendezvous send that a CTS or RNDV_DONE answers, let go of by its
 * wire id and by the transport; NULL (the endpoint failed) if the peer
 * names a send we do not have. */
static slime_req_t *rndv_answered(slime_ep_t *ep, const frame_t *h) {
    slime_req_t *r = lookup(ep, h->a, REQ_SEND, "rendezvous send");
    if (!r) return NULL;
    req_id_release(ep->ctx, r);
    if (ep->tp->rndv_release) ep->tp->rndv_release(ep, r);
    return r;
}

static bool on_cts(slime_ep_t *ep, const frame_t *h) {
    if (h->len || !wire_status_ok(h->u32)) return false;
    slime_req_t *r = rndv_answered(ep, h);
    if (!r) return true;
    if ((int32_t)h->u32 != SLIME_OK) {
        slime_status_t why = (slime_status_t)(int32_t)h->u32;
        if (why == SLIME_ERR_TRUNCATED)
            req_complete(r, why, "receiver's buffer is smaller than the message of %zu bytes", r->len);
        else
            req_complete(r, why, "the receiver dropped the message of %zu bytes (%s)", r->len,
                         slime_strerror(why));
        return true;
    }
    txn_t *t = txn_new(F_DATA, 0);
    if (!t) { ep_fail(ep, SLIME_ERR_NOMEM, "out of memory for a data frame"); return true; }
    t->hdr.a = h->b;
    t->hdr.len = r->len;
    t->payload = r->buf;
    t->req = r;
    send_frame(ep, t);
    return true;
}

static bool on_data(slime_ep_t *ep, const frame_t *h) {
    rx_ctx_t *rx = &ep->rx;
    slime_req_t *r = lookup(ep, h->a, REQ_RECV, "rendezvous receive");
    if (!r) return true;
    if (h->len != r->bytes) return false;
    req_id_release(ep->ctx, r);
    rx->req = r;
    rx->sink = SINK_RECV;
    rx->dst = r->buf;
    return true;
}

static bool on_write(slime_ep_t *ep, const frame_t *h) {
    rx_ctx_t *rx = &ep->rx;
    char why[160];
    uint64_t addr;
    slime_status_t st = mr_own_acquire(ep->ctx, h->a, h->rkey, h->b, h->len, SLIME_ACCESS_REMOTE_WRITE, &addr, why,
                                       sizeof why);
    if (st != SLIME_OK) {
        rx->status = st;
        snprintf(rx->text, sizeof rx->text, "remote region: %s", why);
        return true;
    }
    rx->sink = SINK_WRITE;
    rx->dst = (uint8_t *)(uintptr_t)addr;
    rx->pinned = h->a + 1;
    return true;
}

/* F_WRITE_ACK and F_READ_RESP: a one-sided op of ours is answered. */
static bool on_rma_reply(slime_ep_t *ep, const frame_t *h) {
    rx_ctx_t *rx = &ep->rx;
    if (!wire_status_ok(h->u32)) return false;
    slime_req_t *r = lookup(ep, h->a, h->type == F_WRITE_ACK ? REQ_WRITE : REQ_READ, "one-sided op");
    if (!r) return true;
    rx->req = r;
    rx->status = (slime_status_t)(int32_t)h->u32;
    if (h->type == F_READ_RESP && rx->status == SLIME_OK) {
        if (h->len != r->len) return false;
        rx->sink = SINK_READ;
        rx->dst = r->buf;
        return true;
    }
    if (h->len >= WIRE_ERRTEXT_MAX) return false;
    rx->sink = SINK_TEXT;
    rx->dst = (uint8_t *)rx->text;
    return true;
}

static bool on_read_req(slime_ep_t *ep, const frame_t *h) {
    slime_ctx_t *ctx = ep->ctx;
    if (h->len) return false;
    char why[160];
    uint64_t addr;
    slime_status_t st = mr_own_acquire(ctx, h->a, h->rkey, h->b, h->d, SLIME_ACCESS_REMOTE_READ, &addr, why,
                                       sizeof why);
    if (st != SLIME_OK) {
        char text[200];
        snprintf(text, sizeof text, "remote region: %s", why);
        send_status(ep, F_READ_RESP, h->c, st, text);
        return true;
    }
    txn_t *t;
    if (!reply_new(ep, F_READ_RESP, 0, &t)) {
        mr_own_release(ctx, h->a);
        return true;
    }
    t->hdr.a = h->c;
    t->hdr.len = h->d;
    t->payload = (void *)(uintptr_t)addr;
    t->release_handle = h->a + 1; /* pinned until the bytes are out */
    send_frame(ep, t);
    return true;
}

static bool on_imm(slime_ep_t *ep, const frame_t *h) {
    if (h->len) return false;
    proto_deliver_imm(ep, h->u32);
    return true;
}

static bool on_rndv_done(slime_ep_t *ep, const frame_t *h) {
    if (h->len || !wire_status_ok(h->u32)) return false;
    slime_req_t *r = rndv_answered(ep, h);
    if (!r) return true;
    if ((int32_t)h->u32 == SLIME_OK) req_complete(r, SLIME_OK, NULL);
    else req_complete(r, (slime_status_t)(int32_t)h->u32, "the receiver failed to fetch the message");
    return true;
}

static bool (*const on_frame[F_TYPE_MAX])(slime_ep_t *ep, const frame_t *h) = {
    [F_EAGER] = on_eager,
    [F_RTS] = on_rts,
    [F_CTS] = on_cts,
    [F_DATA] = on_data,
    [F_WRITE] = on_write,
    [F_WRITE_ACK] = on_rma_reply,
    [F_READ_REQ] = on_read_req,
    [F_READ_RESP] = on_rma_reply,
    [F_IMM] = on_imm,
    [F_RNDV_DONE] = on_rndv_done,
    [F_PING] = live_on_ping,
    [F_PONG] = live_on_pong,
};

void proto_set_parked(slime_ep_t *ep, bool on) {
    if (ep->rx.parked == on) return;
    ep->rx.parked = on;
    ep->ctx->n_parked += on ? 1 : -1;
}

void proto_on_header(slime_ep_t *ep) {
    rx_ctx_t *rx = &ep->rx;
    const frame_t *h = &rx->hdr;
    rx->paused = false;
    proto_set_parked(ep, false);
    rx->sink = SINK_DISCARD;
    if (h->type < F_TYPE_MAX && on_frame[h->type] && on_frame[h->type](ep, h)) return;
    ep_fail(ep, SLIME_ERR_PROTOCOL, "peer sent a malformed frame (type %u, %" PRIu64 " bytes)", h->type, h->len);
}

void proto_on_payload(slime_ep_t *ep) {
    slime_ctx_t *ctx = ep->ctx;
    rx_ctx_t *rx = &ep->rx;
    frame_t *h = &rx->hdr;
    slime_req_t *r = rx->req;
    switch (rx->sink) {
    case SINK_RECV:
        r->bytes = h->len;
        req_complete(r, SLIME_OK, NULL);
        return;
    case SINK_UNEXP: {
        umsg_t *m = rx->umsg;
        rx->umsg = NULL;
        /* a receive may have been posted while the payload streamed in */
        if ((r = match_posted(ctx, ep, m->tag))) {
            if (m->len > r->len || recv_misfit(r, m->len)) recv_refuse(r, m->len);
            else {
                recv_deliver(r, m->data, m->len);
                r->bytes = m->len;
                req_complete(r, SLIME_OK, NULL);
            }
            umsg_free(ctx, m);
        } else {
            list_push_back(&ctx->unexpected, &m->link);
        }
        return;
    }
    case SINK_WRITE:
        mr_own_release(ctx, rx->pinned - 1);
        rx->pinned = 0;
        if (h->flags & FF_IMM) proto_deliver_imm(ep, h->u32);
        send_status(ep, F_WRITE_ACK, h->c, SLIME_OK, NULL);
        return;
    case SINK_READ:
        req_complete(r, SLIME_OK, NULL);
        return;
    case SINK_TEXT:
        rx->text[h->len] = 0;
        if (rx->status == SLIME_OK) req_complete(r, SLIME_OK, NULL);
        else req_complete(r, rx->status, "%s", rx->text);
        return;
    case SINK_DISCARD:
        if (h->type == F_EAGER && r) recv_refuse(r, h->len);
        else if (h->type == F_WRITE) send_status(ep, F_WRITE_ACK, h->c, rx->status, rx->text);
        return;
    }
}

/* One-sided requests: by the transport's own copy where it has one,
 * else as frames the target serves. */
static void post_frames(slime_ep_t *ep, slime_req_t *req) {
    txn_t *t = txn_new(req->is_write ? F_WRITE : F_READ_REQ, 0);
    if (!t || !req_id_assign(ep->ctx, req)) {
        free(t);
        req_complete(req, SLIME_ERR_NOMEM, "out of memory posting a one-sided op");
        return;
    }
    t->hdr.a = req->r_handle;
    t->hdr.b = req->r_off;
    t->hdr.c = req->id;
    t->hdr.rkey = req->r_rkey;
    if (req->is_write) {
        t->hdr.len = req->len;
        t->payload = req->buf;
        if (req->has_imm) { t->hdr.flags |= FF_IMM; t->hdr.u32 = req->imm; }
    } else {
        t->hdr.d = req->len;
    }
    frames_queue(ep, t);
}

void proto_post_rma(slime_ep_t *ep, slime_req_t *req) {
    list_push_back(&ep->pending, &req->eplink);
    if (ep->tp->rma_async) {
        ep->tp->rma(ep, req, SIZE_MAX); /* it completes req, now or later */
        return;
    }
    if (ep->tp->rma) {
        bool idle = list_empty(&ep->rmaq);
        list_push_back(&ep->rmaq, &req->qlink);
        /* a batch's small ops are started together, so that the
         * transport sees them queued and can copy them at once */
        if (ep->ctx->rma_batching) return;
        if (idle) proto_rma_start(ep);
        else ctx_post_work(ep->ctx);
        return;
    }
    post_frames(ep, req);
    frames_flush(ep);
}

void proto_rma_start(slime_ep_t *ep) {
    if (!ep->tp->rma || ep->tp->rma_async) return;
    slime_req_t *head = list_first(&ep->rmaq, slime_req_t, qlink);
    /* a small op is done right away: no hand-off */
    if (head && head->len <= RMA_INLINE_MAX) proto_rma_progress(ep);
    if (!list_empty(&ep->rmaq)) ctx_post_work(ep->ctx);
}

int proto_rma_progress(slime_ep_t *ep) {
    int did = 0;
    size_t budget = RMA_CHUNK;
    while (ep->state == EP_UP && budget) {
        slime_req_t *r = list_first(&ep->rmaq, slime_req_t, qlink);
        if (!r) break;
        size_t before = r->done;
        slime_status_t st = ep->tp->rma(ep, r, budget);
        did = 1;
        /* on a failure r is completed, and freed if detached: hands off */
        if (st == SLIME_ERR_PEER_LOST || ep->state != EP_UP) break;
        if (st == SLIME_INPROGRESS) break;
        if (st == SLIME_OK) budget -= min_sz(budget, r->done - before);
        if (st == SLIME_ERR_UNSUPPORTED) {
            /* the transport leaves this op to frames (too large, or the
             * kernel refuses it: then it says so for every op queued) */
            list_del(&r->qlink);
            r->done = 0;
            post_frames(ep, r);
            frames_flush(ep);
            continue;
        }
        if (st != SLIME_OK) continue; /* rma completed it with the error */
        list_del(&r->qlink);
        if (r->has_imm) {
            txn_t *t = txn_new(F_IMM, 0);
            if (!t) { req_complete(r, SLIME_ERR_NOMEM, "out of memory for an immediate"); continue; }
            t->hdr.u32 = r->imm;
            t->req = r; /* done when the immediate is on its way */
            send_frame(ep, t);
        } else {
            req_complete(r, SLIME_OK, NULL);
        }
    }
    return did;
}
