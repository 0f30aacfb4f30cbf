/* Endpoints: one per peer context, whoever dialed.  Connect is symmetric:
 * it returns the endpoint that exists, else dials; when two contexts dial
 * each other at once, the dial of the lower id wins and both end up on
 * that one connection (see hello_accept). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core/internal.h"
#include "transport/transport.h"

static int ep_state(const slime_ep_t *ep) { return __atomic_load_n((const int *)&ep->state, __ATOMIC_ACQUIRE); }
static void ep_set_state(slime_ep_t *ep, enum ep_state s) { __atomic_store_n((int *)&ep->state, (int)s, __ATOMIC_RELEASE); }

slime_ep_t *ep_find(slime_ctx_t *ctx, uint64_t peer_id) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps) {
        slime_ep_t *ep = container_of(pos, slime_ep_t, link);
        if (ep->peer_id == peer_id && ep->state != EP_DOWN) return ep;
    }
    return NULL;
}

slime_ep_t *ep_new(slime_ctx_t *ctx, uint64_t peer_id) {
    slime_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep) return NULL;
    ep->ctx = ctx;
    ep->peer_id = peer_id;
    ep->state = EP_CONNECTING;
    ep->fd = -1;
    atomic_init(&ep->refs, 1); /* ctx->eps */
    list_init(&ep->acceptq);
    list_init(&ep->txq);
    list_init(&ep->pending);
    list_init(&ep->rmaq);
    list_init(&ep->imm_waiters);
    ep->pollable = calloc(1, sizeof *ep->pollable);
    if (!ep->pollable) { free(ep); return NULL; }
    ep->pollable->kind = POLL_EP;
    ep->pollable->obj = ep;
    list_push_back(&ctx->eps, &ep->link);
    return ep;
}

void ep_attach(slime_ep_t *ep, const transport_ops_t *tp, void *conn, int fd, uint32_t peer_pid) {
    slime_ctx_t *ctx = ep->ctx;
    ep->tp = tp;
    ep->conn = conn;
    ep->fd = fd;
    ep->peer_pid = peer_pid;
    ep->verified_pid = tp->verified_pid ? (uint32_t)tp->verified_pid(conn) : 0;
    ep->eager = ctx->tps[tp->wire].eager;
    if (tp->describe) tp->describe(conn, ep->desc, sizeof ep->desc);
    else snprintf(ep->desc, sizeof ep->desc, "%s to peer %016" PRIx64 " (pid %u)", tp->name, ep->peer_id, peer_pid);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = ep->pollable};
    epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev);
    if (!(tp->caps & TP_CAP_POLLED)) ctx->n_fd_eps++;
    ep->local = tp->peer_local && tp->peer_local(conn);
    if (ep->local) atomic_fetch_add_explicit(&ctx->n_local_eps, 1, memory_order_relaxed);
    ep_set_state(ep, EP_UP);
    ctx_wake_sleepers(ctx);
}

static void fail_list(slime_list_t *h, slime_status_t st, const char *why, size_t off) {
    while (!list_empty(h)) {
        slime_req_t *r = (slime_req_t *)((char *)h->next - off);
        req_complete(r, st, "%s", why); /* unlinks r */
    }
}

void ep_fail(slime_ep_t *ep, slime_status_t st, const char *fmt, ...) {
    if (ep->state == EP_DOWN) return;
    slime_ctx_t *ctx = ep->ctx;
    bool was_up = ep->state == EP_UP;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ep->down_reason, sizeof ep->down_reason, fmt, ap);
    va_end(ap);
    ep->down_status = st;
    ep_set_state(ep, EP_DOWN);
    char why[224];
    snprintf(why, sizeof why, "peer %016" PRIx64 ": %s", ep->peer_id, ep->down_reason);
    if (was_up) {
        epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
        if (!(ep->tp->caps & TP_CAP_POLLED)) ctx->n_fd_eps--;
        if (ep->local) atomic_fetch_sub_explicit(&ctx->n_local_eps, 1, memory_order_relaxed);
        ep->local = false;
        ep->tp->close(ep);
        ep->fd = -1;
    }
    /* frames never sent: their requests fail, pinned regions unpin */
    while (!list_empty(&ep->txq)) {
        txn_t *t = container_of(ep->txq.next, txn_t, link);
        list_del(&t->link);
        if (t->req) req_complete(t->req, st, "%s", why);
        if (t->release_handle) mr_own_release(ctx, t->release_handle - 1);
        if (t->held) ep_unhold(ep);
        free(t);
    }
    if (ep->rx.pinned) {
        mr_own_release(ctx, ep->rx.pinned - 1);
        ep->rx.pinned = 0;
    }
    proto_set_parked(ep, false); /* its payload went with the connection */
    if (ep->rx.sink == SINK_UNEXP && ep->rx.umsg && ep->rx.state == RX_PAYLOAD) {
        umsg_free(ctx, ep->rx.umsg); /* never made it to the queue */
        ep->rx.umsg = NULL;
    }
    fail_list(&ep->pending, st, why, offsetof(slime_req_t, eplink));
    fail_list(&ep->rmaq, st, why, offsetof(slime_req_t, qlink));
    fail_list(&ep->imm_waiters, st, why, offsetof(slime_req_t, qlink));
    /* a rendezvous from a dead sender can never deliver */
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->unexpected) {
        umsg_t *m = container_of(pos, umsg_t, link);
        if (m->ep == ep && m->rts) umsg_free(ctx, m);
    }
    ctx_wake_sleepers(ctx);
}

void ep_free(slime_ep_t *ep) {
    free(ep->imms);
    free(ep->pollable);
    free(ep);
}

/* Only the context's ref is left, and none is taken without ctx->lock,
 * so nobody else can reach it. */
bool ep_reap(slime_ep_t *ep) {
    if (ep->state != EP_DOWN || ep->holds || ep->dialing || list_linked(&ep->acceptq) ||
        atomic_load_explicit(&ep->refs, memory_order_acquire) != 1)
        return false;
    list_del(&ep->link);
    ep_free(ep);
    return true;
}

void ep_unref(slime_ep_t *ep) {
    /* zero only once the context let go of it (ep_orphan) */
    if (atomic_fetch_sub_explicit(&ep->refs, 1, memory_order_acq_rel) == 1) ep_free(ep);
}

void ep_orphan(slime_ep_t *ep) {
    list_del(&ep->link);
    ep_unref(ep);
}

void slime_ep_hold(slime_ep_t *ep) {
    if (!ep) return;
    pthread_mutex_lock(&ep->ctx->lock);
    ep->holds++;
    pthread_mutex_unlock(&ep->ctx->lock);
}

void slime_ep_release(slime_ep_t *ep) {
    if (!ep) return;
    pthread_mutex_lock(&ep->ctx->lock);
    if (ep->holds) ep->holds--;
    pthread_mutex_unlock(&ep->ctx->lock);
}

bool ep_has_cap(const slime_ep_t *ep, unsigned caps) {
    const transport_ops_t *tp = ep ? ep->tp : NULL;
    return tp && (tp->caps & caps) == caps;
}

static bool ep_settled(void *arg) { return ep_state(arg) != EP_CONNECTING; }

static slime_status_t settle(slime_ctx_t *ctx, slime_ep_t *ep, uint64_t deadline, slime_ep_t **out) {
    /* someone else is bringing this endpoint up: wait for the outcome */
    ep_ref(ep);
    pthread_mutex_unlock(&ctx->lock);
    bool ok = ctx_wait_until(ctx, ep_settled, ep, deadline);
    pthread_mutex_lock(&ctx->lock);
    ep_unref(ep);
    if (!ok) {
        slime_status_t st =
            slime_errorf(SLIME_ERR_TIMEOUT, "connect: timed out waiting for peer %016" PRIx64, ep->peer_id);
        /* nobody of ours is dialing: the peer said its dial would come (or
         * that it was connected) and it never came.  Left connecting, the
         * endpoint would make every later connect wait for it too. */
        if (ep->state == EP_CONNECTING && !ep->dialing) {
            ep_fail(ep, st, "the peer's connection never came");
            slime_errorf(st, "connect: timed out waiting for peer %016" PRIx64, ep->peer_id);
        }
        return st;
    }
    if (ep->state == EP_UP) { *out = ep; return SLIME_OK; }
    return slime_errorf(ep->down_status ? ep->down_status : SLIME_ERR_PEER_LOST, "connect: %s", ep->down_reason);
}

static void close_unused(const transport_ops_t *tp, void *conn, int fd) {
    if (conn) {
        slime_ep_t tmp = {.conn = conn, .fd = fd};
        tp->close(&tmp);
    } else if (fd >= 0) {
        close(fd);
    }
}

slime_status_t slime_ep_connect(slime_ctx_t *ctx, const void *addr, size_t addr_len, int64_t timeout_ms,
                                slime_ep_t **out) {
    if (out) *out = NULL;
    if (!ctx || !out) return slime_errorf(SLIME_ERR_INVAL, "connect: NULL argument");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "connect: negative timeout");
    wire_addr_t wa;
    slime_status_t st = address_parse(addr, addr_len, &wa);
    if (st != SLIME_OK) return st;
    if (wa.ctx_id == ctx->id) return slime_errorf(SLIME_ERR_INVAL, "connect: that is this context's own address");
    const transport_ops_t *tp;
    if ((st = transports_choose(ctx, &wa, &tp)) != SLIME_OK) return st;
    uint64_t deadline = deadline_after_ms(timeout_ms);

    pthread_mutex_lock(&ctx->lock);
    slime_ep_t *ep = ep_find(ctx, wa.ctx_id);
    if (ep && ep->state == EP_UP) { *out = ep; goto out; }
    if (ep) { st = settle(ctx, ep, deadline, out); goto out; }
    if (!(ep = ep_new(ctx, wa.ctx_id))) { st = slime_errorf(SLIME_ERR_NOMEM, "connect"); goto out; }
    ep->peer_job = wa.flags & ADDR_CAPABILITY ? wa.cap_job : ctx->job;
    ep->dialing = true;
    pthread_mutex_unlock(&ctx->lock);

    void *conn = NULL;
    int fd = -1;
    wire_welcome_t w;
    memset(&w, 0, sizeof w);
    st = tp->dial(ctx, &wa, deadline, &conn, &fd, &w);
    if (st == SLIME_OK) st = welcome_check(ctx, &w);

    pthread_mutex_lock(&ctx->lock);
    ep->dialing = false;
    if (st == SLIME_OK && w.verdict == WELCOME_OK && ep->state == EP_CONNECTING) {
        ep_attach(ep, tp, conn, fd, w.pid);
        *out = ep;
        goto out;
    }
    close_unused(tp, conn, fd);
    if (ep->state == EP_UP) { *out = ep; st = SLIME_OK; goto out; } /* the peer's dial won */
    if (st == SLIME_OK && w.verdict == WELCOME_DUPLICATE) { st = settle(ctx, ep, deadline, out); goto out; }
    if (ep->state == EP_CONNECTING) {
        char why[160];
        snprintf(why, sizeof why, "%s", slime_last_error());
        ep_fail(ep, st, "%s", why);
        slime_errorf(st, "%s", why); /* ep_fail may have overwritten it */
    }
out:
    if (st == SLIME_OK) (*out)->holds++;
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

static bool have_accepted(void *arg) {
    slime_ctx_t *ctx = arg;
    return __atomic_load_n(&ctx->accepted.next, __ATOMIC_ACQUIRE) != &ctx->accepted;
}

slime_status_t slime_ep_accept(slime_ctx_t *ctx, int64_t timeout_ms, slime_ep_t **out) {
    if (out) *out = NULL;
    if (!ctx || !out) return slime_errorf(SLIME_ERR_INVAL, "accept: NULL argument");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "accept: negative timeout");
    uint64_t deadline = deadline_after_ms(timeout_ms);
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        slime_ep_t *ep = list_first(&ctx->accepted, slime_ep_t, acceptq);
        if (ep) {
            list_del(&ep->acceptq);
            ep->holds++;
            pthread_mutex_unlock(&ctx->lock);
            *out = ep;
            return SLIME_OK;
        }
        pthread_mutex_unlock(&ctx->lock);
        if (!ctx_wait_until(ctx, have_accepted, ctx, deadline))
            return slime_errorf(SLIME_ERR_TIMEOUT, "accept: no peer connected within %lld ms", (long long)timeout_ms);
    }
}

const char *slime_ep_transport(const slime_ep_t *ep) { return ep && ep->tp ? ep->tp->name : "none"; }
const char *slime_ep_describe(const slime_ep_t *ep) { return ep && ep->desc[0] ? ep->desc : "not connected"; }
uint64_t slime_ep_peer_id(const slime_ep_t *ep) { return ep ? ep->peer_id : 0; }

slime_status_t slime_ep_status(const slime_ep_t *ep) {
    if (!ep) return SLIME_ERR_INVAL;
    int s = ep_state(ep);
    return s == EP_DOWN ? ep->down_status : SLIME_OK;
}

const char *p2p_ep_down_reason(const slime_ep_t *ep) { return ep_state(ep) == EP_DOWN ? ep->down_reason : ""; }

/* Under ctx->lock: what ep's transport took is all with the peer. */
static bool ep_tx_settled(slime_ep_t *ep) {
    return ep->state != EP_UP || !ep->tp->tx_unsent || !ep->tp->tx_unsent(ep);
}

static bool eps_tx_settled(slime_ctx_t *ctx, slime_ep_t *only) {
    if (only) return ep_tx_settled(only);
    for (slime_list_t *pos = ctx->eps.next; pos != &ctx->eps; pos = pos->next)
        if (!ep_tx_settled(container_of(pos, slime_ep_t, link))) return false;
    return true;
}

void ep_linger(slime_ctx_t *ctx, slime_ep_t *only) {
    /* a peer that takes nothing in that long would be taken for dead */
    const uint64_t deadline = now_ns() + (ctx->silence_ns ? ctx->silence_ns : 1000000000ull);
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        /* most closes have nothing unsent: no progress pass for them */
        bool settled = eps_tx_settled(ctx, only);
        if (!settled) {
            progress_locked(ctx);
            settled = eps_tx_settled(ctx, only);
        }
        pthread_mutex_unlock(&ctx->lock);
        if (settled || now_ns() >= deadline) return;
        usleep(100);
    }
}

void slime_ep_close(slime_ep_t *ep) {
    if (!ep) return;
    ep_ref(ep);
    ep_linger(ep->ctx, ep);
    pthread_mutex_lock(&ep->ctx->lock);
    ep_fail(ep, SLIME_ERR_CLOSED, "endpoint closed by this side");
    pthread_mutex_unlock(&ep->ctx->lock);
    ep_unref(ep);
}
