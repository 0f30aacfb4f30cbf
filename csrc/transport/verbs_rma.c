/* One-sided transfers as native RDMA: user read/write/write_imm against
 * a peer's region, and the receiver's fetch of a large message (the
 * rendezvous by RDMA READ from the sender's buffer).
 *
 * A transfer is cut in chunks of dev->chunk bytes, posted round robin
 * over the endpoint's QPs as queue room allows, so one large transfer
 * keeps every QP busy.  A write_imm's immediate must reach the peer only
 * once all its data is in place, and QPs do not order against each other:
 * a transfer of one chunk goes as a single WRITE_WITH_IMM on QP 0; a
 * larger one writes its chunks first and, once all have completed (RC
 * completion = acknowledged by the peer), sends a zero-length
 * WRITE_WITH_IMM on QP 0.  That consumes one of the peer's receives, so it
 * waits for a credit like a SEND.  Immediates leave in the order their
 * write_imms were posted (imm_q, from the moment of posting), so the peer
 * collects them in that order. */
#ifdef SLIME_HAVE_VERBS

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/verbs_internal.h"

vop_t *vop_new(verbs_conn_t *c, enum vop_role role, slime_req_t *req) {
    vop_t *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->kind = VW_OP;
    op->role = role;
    op->req = req;
    list_init(&op->qlink);
    list_init(&op->ilink);
    list_push_back(&c->ops, &op->link);
    return op;
}

static void vop_free(verbs_conn_t *c, vop_t *op) {
    if (op->rmr) rkeys_op_done(c, op->rmr);
    if (op->reg) regcache_put(c->dev->md, op->reg);
    list_del(&op->link);
    list_del(&op->qlink);
    list_del(&op->ilink);
    free(op);
}

void vop_fail(verbs_conn_t *c, vop_t *op, slime_status_t st, const char *fmt, ...) {
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    slime_req_t *req = op->req;
    vop_free(c, op);
    if (req) req_complete(req, st, "%s", text);
}

void vops_free_all(verbs_conn_t *c) {
    /* the core fails their requests (they are on ep->pending); the
     * remote regions they used go with the conn, unacknowledged */
    while (!list_empty(&c->ops)) {
        vop_t *op = container_of(c->ops.next, vop_t, link);
        op->rmr = NULL;
        vop_free(c, op);
    }
}

void vop_queue(verbs_conn_t *c, vop_t *op) {
    list_del(&op->qlink);
    op->bound = true;
    /* one chunk with an immediate goes whole as the WRITE_WITH_IMM */
    if (!(op->has_imm && op->len <= c->dev->chunk)) list_push_back(&c->post_q, &op->qlink);
}

static int free_qp(verbs_conn_t *c) {
    for (int k = 0; k < c->n_qps; k++) {
        int q = (int)((c->next_qp + (unsigned)k) % (unsigned)c->n_qps);
        if (c->rd_used[q] < c->dev->sq_depth) {
            c->next_qp = (unsigned)q + 1;
            return q;
        }
    }
    return -1;
}

static bool post_wr(slime_ep_t *ep, int q, vop_t *op, enum ibv_wr_opcode opcode, size_t off, size_t len) {
    verbs_conn_t *c = ep->conn;
    struct ibv_sge sge = {.addr = (uintptr_t)(op->laddr + off), .length = (uint32_t)len, .lkey = op->lkey};
    struct ibv_send_wr wr = {
        .wr_id = (uintptr_t)op,
        .sg_list = &sge,
        .num_sge = len ? 1 : 0,
        .opcode = opcode,
        .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = op->raddr + off, .rkey = op->rkey},
    };
    if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htonl(op->imm);
    struct ibv_send_wr *bad;
    vconn_will_post(c);
    int e = ibv_post_send(c->qp[q], &wr, &bad);
    if (e) {
        vconn_fail(ep, "ibv_post_send of an RDMA %s on QP %d: %s", op->is_read ? "read" : "write", q, strerror(e));
        return false;
    }
    c->rd_used[q]++;
    op->outstanding++;
    return true;
}

bool vops_post(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    if (!c->peer_ready) return true;
    vop_t *op;
    while ((op = list_first(&c->post_q, vop_t, qlink))) {
        while (op->posted < op->len) {
            int q = free_qp(c);
            if (q < 0) return true; /* completions will make room */
            size_t k = min_sz(c->dev->chunk, op->len - op->posted);
            if (!post_wr(ep, q, op, op->is_read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, op->posted, k)) return false;
            op->posted += k;
        }
        list_del(&op->qlink);
    }
    /* immediates, in posting order: each spends a credit (a receive at
     * the peer); a large write's waits until all its chunks are acked */
    while ((op = list_first(&c->imm_q, vop_t, ilink)) && c->credits >= 2 && c->rd_used[0] < c->dev->sq_depth) {
        bool whole = op->bound && op->len <= c->dev->chunk && op->posted == 0;
        bool acked = op->bound && op->posted == op->len && op->outstanding == 0;
        if (!whole && !acked) break;
        size_t k = op->len - op->posted; /* all of a one-chunk write, else 0 */
        c->credits--;
        if (!post_wr(ep, 0, op, IBV_WR_RDMA_WRITE_WITH_IMM, op->posted, k)) return false;
        op->posted += k;
        op->imm_posted = true;
        list_del(&op->ilink);
    }
    return true;
}

bool vop_completed(slime_ep_t *ep, vop_t *op) {
    verbs_conn_t *c = ep->conn;
    op->outstanding--;
    if (op->outstanding || op->posted < op->len) return true;
    if (op->has_imm && !op->imm_posted) return true; /* now its immediate (vops_post) */
    slime_req_t *req = op->req;
    uint64_t sreq = op->sreq;
    enum vop_role role = op->role;
    vop_free(c, op);
    req_complete(req, SLIME_OK, NULL);
    if (role == VOP_FETCH) proto_rndv_done(ep, sreq, SLIME_OK);
    return ep->state == EP_UP;
}

slime_status_t verbs_rma(slime_ep_t *ep, slime_req_t *req, size_t max) {
    (void)max; /* posting is cheap: every request is taken whole */
    verbs_conn_t *c = ep->conn;
    c->ep = ep;
    uint32_t lkey;
    bool writable;
    if (!verbs_mr_keys(req->local_mr, &lkey, NULL, &writable)) {
        req_complete(req, SLIME_ERR_ACCESS, "local region is not registered with the RDMA device");
        return SLIME_ERR_ACCESS;
    }
    if (!req->is_write && !writable) {
        req_complete(req, SLIME_ERR_ACCESS, "local region is read-only memory: a read cannot land in it");
        return SLIME_ERR_ACCESS;
    }
    vop_t *op = vop_new(c, VOP_RMA, req);
    if (!op) {
        req_complete(req, SLIME_ERR_NOMEM, "out of memory posting a one-sided op");
        return SLIME_ERR_NOMEM;
    }
    op->is_read = !req->is_write;
    op->has_imm = req->has_imm;
    op->imm = req->imm;
    op->laddr = req->buf;
    op->lkey = lkey;
    op->len = req->len;
    if (op->has_imm) list_push_back(&c->imm_q, &op->ilink);
    rkeys_submit(ep, op);
    if (ep->state == EP_UP) vconn_kick(ep);
    return SLIME_INPROGRESS;
}

/* ---- rendezvous by RDMA READ ---- */

typedef struct offer {
    slime_list_t link;
    slime_req_t *req;
    regent_t *reg;
} offer_t;

void verbs_rndv_offer(slime_ep_t *ep, slime_req_t *send, frame_t *rts) {
    verbs_conn_t *c = ep->conn;
    /* below rndv_min, copying through the stream beats registering */
    regent_t *e = regcache_get(c->dev->md, send->buf, send->len, SLIME_ACCESS_REMOTE_READ, c->dev->rndv_min);
    if (!e) return; /* a plain RTS: the data goes by the stream */
    offer_t *o = malloc(sizeof *o);
    if (!o) {
        regcache_put(c->dev->md, e);
        return;
    }
    o->req = send;
    o->reg = e;
    list_push_back(&c->offers, &o->link);
    rts->flags |= FF_RDMA;
    rts->d = (uint64_t)(uintptr_t)send->buf;
    rts->rkey = regent_rkey(e);
}

void verbs_rndv_release(slime_ep_t *ep, slime_req_t *send) {
    verbs_conn_t *c = ep->conn;
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &c->offers) {
        offer_t *o = container_of(pos, offer_t, link);
        if (o->req != send) continue;
        list_del(&o->link);
        regcache_put(c->dev->md, o->reg);
        free(o);
        return;
    }
}

void verbs_offers_free(verbs_conn_t *c) {
    while (!list_empty(&c->offers)) {
        offer_t *o = container_of(c->offers.next, offer_t, link);
        list_del(&o->link);
        regcache_put(c->dev->md, o->reg);
        free(o);
    }
}

slime_status_t verbs_rndv_fetch(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq, uint64_t raddr, uint32_t rkey,
                                uint64_t len) {
    verbs_conn_t *c = ep->conn;
    c->ep = ep;
    regent_t *e = regcache_get(c->dev->md, recv->buf, len, MD_ACCESS_LOCAL_WRITE, 0);
    if (!e) return SLIME_ERR_UNSUPPORTED; /* the sender sends it by the stream */
    vop_t *op = vop_new(c, VOP_FETCH, recv);
    if (!op) {
        regcache_put(c->dev->md, e);
        return SLIME_ERR_NOMEM;
    }
    op->is_read = true;
    op->laddr = recv->buf;
    op->lkey = regent_lkey(e);
    op->raddr = raddr;
    op->rkey = rkey;
    op->len = len;
    op->reg = e;
    op->sreq = sreq;
    vop_queue(c, op);
    vconn_kick(ep);
    return SLIME_OK;
}

#else
typedef int verbs_rma_unused;
#endif
