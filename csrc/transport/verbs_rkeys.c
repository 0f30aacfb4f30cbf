/* The keys of remote regions: asked once, trusted until revoked.
 *
 * A descriptor is only a claim: an RDMA access the peer's device refuses
 * (bad key, out of bounds, deregistered region) breaks the RC queue pair
 * and with it the whole endpoint.  So the initiator never posts on the
 * strength of a descriptor: the first op on a region asks its owner
 * (QUERY: handle + the descriptor's key), and the owner answers from its
 * MR table what the region really is (address, length, access, verbs
 * rkey), or why not.  The answer is cached per endpoint and every later
 * op is checked against it locally, then posted natively: the owner's
 * code takes no part any more.
 *
 * While a peer holds a region's key, the owner holds a pin on its table
 * entry for that peer.  Deregistration marks the entry dying, sends REVOKE
 * to each such peer and waits for the pins (slime_mr_dereg's wait); a peer
 * answers REVOKED once its ops on the region have completed, and new ops
 * ask again (and are refused).  A lost peer's pins go with its endpoint. */
#ifdef SLIME_HAVE_VERBS

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/verbs_internal.h"

enum { VC_QUERY = 1, VC_ANSWER, VC_REVOKE, VC_REVOKED };

typedef struct vctrl {
    uint8_t type;
    uint8_t pad[3];
    int32_t status;
    uint64_t handle;
    uint32_t rkey;  /* the descriptor's key, checked by the owner */
    uint32_t vrkey; /* ANSWER: the device's key */
    uint64_t addr, len;
    uint32_t access;
    uint32_t pad2;
    char text[160]; /* ANSWER: why not */
} vctrl_t;

enum rmr_state { RMR_QUERYING = 1, RMR_VALID, RMR_REVOKED };

struct rmr {
    slime_list_t link; /* conn->rmrs */
    uint64_t handle;
    uint32_t rkey;
    enum rmr_state state;
    uint64_t addr, len;
    uint32_t vrkey;
    unsigned access;
    unsigned users;        /* ops posted against it */
    slime_list_t waiting;  /* ops waiting for the answer */
};

static rmr_t *find(verbs_conn_t *c, uint64_t handle, uint32_t rkey) {
    slime_list_t *pos;
    for (pos = c->rmrs.next; pos != &c->rmrs; pos = pos->next) {
        rmr_t *m = container_of(pos, rmr_t, link);
        if (m->handle == handle && m->rkey == rkey && m->state != RMR_REVOKED) return m;
    }
    return NULL;
}

static void rmr_free(rmr_t *m) {
    list_del(&m->link);
    free(m);
}

static bool send_ctrl(slime_ep_t *ep, const vctrl_t *m) {
    /* the text only matters in answers that say no */
    size_t len = m->type == VC_ANSWER && m->status != SLIME_OK ? sizeof *m : offsetof(vctrl_t, text);
    return vconn_send_ctrl(ep, m, len);
}

/* A validated region: check op against it and queue it. */
static void bind(verbs_conn_t *c, rmr_t *m, vop_t *op) {
    slime_req_t *req = op->req;
    unsigned need = op->is_read ? SLIME_ACCESS_REMOTE_READ : SLIME_ACCESS_REMOTE_WRITE;
    if ((m->access & need) != need) {
        vop_fail(c, op, SLIME_ERR_ACCESS, "remote region: region does not allow remote %s",
                 op->is_read ? "read" : "write");
        return;
    }
    if (req->r_off > m->len || op->len > m->len - req->r_off) {
        vop_fail(c, op, SLIME_ERR_ACCESS,
                 "remote region: range [%" PRIu64 ", +%zu) is outside the region of %" PRIu64 " bytes", req->r_off,
                 op->len, m->len);
        return;
    }
    op->raddr = m->addr + req->r_off;
    op->rkey = m->vrkey;
    op->rmr = m;
    m->users++;
    vop_queue(c, op);
}

void rkeys_submit(slime_ep_t *ep, vop_t *op) {
    verbs_conn_t *c = ep->conn;
    slime_req_t *req = op->req;
    rmr_t *m = find(c, req->r_handle, req->r_rkey);
    if (!m) {
        if (!(m = calloc(1, sizeof *m))) {
            vop_fail(c, op, SLIME_ERR_NOMEM, "out of memory for a remote region");
            return;
        }
        m->handle = req->r_handle;
        m->rkey = req->r_rkey;
        m->state = RMR_QUERYING;
        list_init(&m->waiting);
        list_push_back(&c->rmrs, &m->link);
        vctrl_t q = {.type = VC_QUERY, .handle = m->handle, .rkey = m->rkey};
        list_push_back(&m->waiting, &op->qlink);
        send_ctrl(ep, &q);
        return;
    }
    if (m->state == RMR_QUERYING) list_push_back(&m->waiting, &op->qlink);
    else bind(c, m, op);
}

bool rkeys_asking(slime_ep_t *ep) {
    const verbs_conn_t *c = ep->conn;
    for (const slime_list_t *pos = c->rmrs.next; pos != &c->rmrs; pos = pos->next) {
        const rmr_t *m = container_of(pos, rmr_t, link);
        if (m->state == RMR_QUERYING && !list_empty(&m->waiting)) return true;
    }
    return false;
}

void rkeys_op_done(verbs_conn_t *c, rmr_t *m) {
    if (--m->users || m->state != RMR_REVOKED) return;
    vctrl_t ack = {.type = VC_REVOKED, .handle = m->handle};
    rmr_free(m);
    send_ctrl(c->ep, &ack);
}

static void peer_pin_set(verbs_conn_t *c, uint32_t slot) { c->peer_pins[slot / 64] |= 1ull << (slot % 64); }
static void peer_pin_clear(verbs_conn_t *c, uint32_t slot) { c->peer_pins[slot / 64] &= ~(1ull << (slot % 64)); }
static bool peer_pin_has(const verbs_conn_t *c, uint32_t slot) {
    return (c->peer_pins[slot / 64] >> (slot % 64)) & 1;
}

/* Owner side: what is this region?  Answered from our own record of it
 * (ctx->mr_slots), never the shared table peers can write; a yes pins it
 * for the peer. */
static bool on_query(slime_ep_t *ep, const vctrl_t *q) {
    verbs_conn_t *c = ep->conn;
    slime_ctx_t *ctx = ep->ctx;
    vctrl_t a = {.type = VC_ANSWER, .handle = q->handle, .rkey = q->rkey};
    uint64_t addr;
    slime_status_t st = mr_own_acquire(ctx, q->handle, q->rkey, 0, 0, 0, &addr, a.text, sizeof a.text);
    a.status = st;
    uint32_t slot = (uint32_t)(q->handle >> 32);
    if (st == SLIME_OK && !(c->dev->slot_vkey[slot] & VKEY_VALID)) {
        mr_own_release(ctx, q->handle);
        st = a.status = SLIME_ERR_ACCESS;
        snprintf(a.text, sizeof a.text, "region is not registered with the RDMA device (it could not be pinned)");
    }
    if (st == SLIME_OK) {
        const slime_mr_t *mr = ctx->mr_slots[slot];
        a.addr = addr;
        a.len = mr->len;
        a.access = mr->access;
        a.vrkey = (uint32_t)c->dev->slot_vkey[slot];
        if (peer_pin_has(c, slot)) mr_own_release(ctx, q->handle); /* one pin per peer */
        else peer_pin_set(c, slot);
    }
    return send_ctrl(ep, &a);
}

/* Initiator side: the owner's answer releases the ops that waited. */
static bool on_answer(slime_ep_t *ep, const vctrl_t *a) {
    verbs_conn_t *c = ep->conn;
    rmr_t *m = find(c, a->handle, a->rkey);
    if (!m || m->state != RMR_QUERYING) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: peer answered a region query we did not make");
        return false;
    }
    if (a->status == SLIME_OK) {
        m->state = RMR_VALID;
        m->addr = a->addr;
        m->len = a->len;
        m->vrkey = a->vrkey;
        m->access = a->access;
    }
    char text[sizeof a->text + 1];
    memcpy(text, a->text, sizeof a->text);
    text[sizeof a->text] = 0;
    slime_status_t st = a->status >= SLIME_ERR_BUSY && a->status < 0 ? (slime_status_t)a->status : SLIME_ERR_ACCESS;
    while (!list_empty(&m->waiting)) {
        vop_t *op = container_of(m->waiting.next, vop_t, qlink);
        list_del(&op->qlink);
        if (a->status == SLIME_OK) bind(c, m, op);
        else vop_fail(c, op, st, "remote region: %s", text);
    }
    if (a->status != SLIME_OK) rmr_free(m); /* a later op asks again */
    return ep->state == EP_UP;
}

/* Initiator side: the owner deregisters a region we hold. */
static bool on_revoke(slime_ep_t *ep, const vctrl_t *r) {
    verbs_conn_t *c = ep->conn;
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &c->rmrs) {
        rmr_t *m = container_of(pos, rmr_t, link);
        if (m->handle != r->handle || m->state != RMR_VALID) continue;
        m->state = RMR_REVOKED; /* find() skips it: new ops ask again */
        if (m->users) return true; /* acknowledged when they finish */
        rmr_free(m);
        break;
    }
    vctrl_t ack = {.type = VC_REVOKED, .handle = r->handle};
    return send_ctrl(ep, &ack);
}

/* Owner side: the peer dropped the key; its pin goes. */
static bool on_revoked(slime_ep_t *ep, const vctrl_t *r) {
    verbs_conn_t *c = ep->conn;
    uint32_t slot = (uint32_t)(r->handle >> 32);
    if (slot < MR_TABLE_SLOTS && peer_pin_has(c, slot)) {
        peer_pin_clear(c, slot);
        mr_own_release(ep->ctx, r->handle);
    }
    return true;
}

bool rkeys_on_ctrl(slime_ep_t *ep, const uint8_t *msg, size_t len) {
    vctrl_t m;
    memset(&m, 0, sizeof m);
    if (len < offsetof(vctrl_t, text) || len > sizeof m) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: control message of %zu bytes", len);
        return false;
    }
    memcpy(&m, msg, len);
    switch (m.type) {
    case VC_QUERY: return on_query(ep, &m);
    case VC_ANSWER: return on_answer(ep, &m);
    case VC_REVOKE: return on_revoke(ep, &m);
    case VC_REVOKED: return on_revoked(ep, &m);
    }
    ep_fail(ep, SLIME_ERR_PROTOCOL, "verbs: unknown control message %u", m.type);
    return false;
}

void rkeys_revoke(slime_ctx_t *ctx, const slime_mr_t *mr) {
    vctrl_t r = {.type = VC_REVOKE, .handle = (uint64_t)mr->slot << 32 | mr->gen};
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps) {
        slime_ep_t *ep = container_of(pos, slime_ep_t, link);
        if (ep->state != EP_UP || ep->tp->wire != WIRE_TRANSPORT_VERBS) continue;
        verbs_conn_t *c = ep->conn;
        c->ep = ep;
        if (peer_pin_has(c, mr->slot)) send_ctrl(ep, &r);
    }
}

void rkeys_conn_close(verbs_conn_t *c) {
    for (uint32_t w = 0; c->peer_pins && w < MR_TABLE_SLOTS / 64; w++)
        for (uint32_t b = 0; c->peer_pins[w] && b < 64; b++)
            if ((c->peer_pins[w] >> b) & 1) {
                c->peer_pins[w] &= ~(1ull << b);
                mr_own_release(c->ctx, (uint64_t)(w * 64 + b) << 32);
            }
    while (!list_empty(&c->rmrs)) rmr_free(container_of(c->rmrs.next, rmr_t, link));
}

#else
typedef int verbs_rkeys_unused;
#endif
