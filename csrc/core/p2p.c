/* The core's side of core/p2p.h: thin functions over its internals, so
 * that the collectives and RPC never see a core struct. */
#include <stdio.h>

#include "core/internal.h"
#include "core/p2p.h"

slime_status_t p2p_recv(slime_ep_t *ep, void *buf, size_t cap, uint64_t tag, const recv_opts_t *o,
                        slime_req_t **out) {
    return ep_recv_opts(ep, buf, cap, tag, o, out);
}

slime_status_t p2p_req_state(const slime_req_t *req) {
    return atomic_load_explicit(&req->state, memory_order_acquire);
}

bool p2p_wait_until(slime_ctx_t *ctx, bool (*done)(void *arg), void *arg, uint64_t deadline_ns) {
    return ctx_wait_until(ctx, done, arg, deadline_ns);
}

void p2p_wake_waiters(slime_ctx_t *ctx) { ctx_wake_sleepers(ctx); }

slime_req_t *p2p_req_worker_new(slime_ctx_t *ctx, p2p_run_here_fn run_here, void *arg) {
    slime_req_t *req = req_new(ctx, REQ_WORKER, NULL);
    if (!req) return NULL;
    req->run_here = run_here;
    req->run_here_arg = arg;
    return req;
}

void p2p_req_worker_complete(slime_req_t *req, slime_status_t st, const char *fmt, ...) {
    slime_ctx_t *ctx = req->ctx;
    char text[512];
    text[0] = 0; /* not `= ""`, which clears all 512 bytes on every success */
    if (fmt && st != SLIME_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&ctx->lock);
    req_complete(req, st, "%s", text);
    pthread_mutex_unlock(&ctx->lock);
}

size_t p2p_drop_unexpected(slime_ctx_t *ctx, bool (*stale)(uint64_t tag, void *arg), void *arg) {
    pthread_mutex_lock(&ctx->lock);
    size_t n = proto_drop_unexpected(ctx, stale, arg);
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

slime_ctx_t *p2p_ep_ctx(const slime_ep_t *ep) { return ep->ctx; }

void p2p_ep_fail(slime_ep_t *ep, slime_status_t st, const char *fmt, ...) {
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&ep->ctx->lock);
    ep_fail(ep, st, "%s", text);
    pthread_mutex_unlock(&ep->ctx->lock);
}

bool p2p_ep_can(const slime_ep_t *ep, p2p_cap_t cap) {
    switch (cap) {
    case P2P_CAP_CPU_RMA: return ep_has_cap(ep, TP_CAP_CPU_RMA);
    }
    return false;
}
