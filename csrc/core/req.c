/* Requests: completion, waiting, cancellation, and the wire ids by which
 * a peer refers to one of our requests (slot + generation, so a late or
 * forged id never reaches a freed request). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

slime_req_t *req_new(slime_ctx_t *ctx, enum req_kind kind, slime_ep_t *ep) {
    slime_req_t *r = req_cache_take();
    if (!r) return NULL;
    r->ctx = ctx;
    r->kind = kind;
    r->ep = ep;
    if (ep) ep_ref(ep);
    atomic_init(&r->state, SLIME_INPROGRESS);
    list_init(&r->qlink);
    list_init(&r->eplink);
    list_init(&r->cblink);
    return r;
}

static void req_destroy(slime_req_t *r) {
    if (r->ep) ep_unref(r->ep);
    free(r->error);
    req_cache_give(r);
}

uint64_t req_id_assign(slime_ctx_t *ctx, slime_req_t *req) {
    if (ctx->n_free == 0) {
        uint32_t cap = ctx->ids_cap ? ctx->ids_cap * 2 : 256;
        slime_req_t **ids = realloc(ctx->ids, cap * sizeof *ids);
        if (ids) ctx->ids = ids;
        uint32_t *gen = ids ? realloc(ctx->id_gen, cap * sizeof *gen) : NULL;
        if (gen) ctx->id_gen = gen;
        uint32_t *fr = gen ? realloc(ctx->id_free, cap * sizeof *fr) : NULL;
        if (!fr) return 0;
        ctx->id_free = fr;
        for (uint32_t i = ctx->ids_cap; i < cap; i++) {
            ctx->ids[i] = NULL;
            ctx->id_gen[i] = 1;
            ctx->id_free[ctx->n_free++] = cap - 1 - (i - ctx->ids_cap);
        }
        ctx->ids_cap = cap;
    }
    uint32_t slot = ctx->id_free[--ctx->n_free];
    ctx->ids[slot] = req;
    req->id = (uint64_t)ctx->id_gen[slot] << 32 | slot;
    return req->id;
}

slime_req_t *req_id_lookup(slime_ctx_t *ctx, uint64_t id) {
    uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (slot >= ctx->ids_cap || ctx->id_gen[slot] != gen) return NULL;
    return ctx->ids[slot];
}

void req_id_release(slime_ctx_t *ctx, slime_req_t *req) {
    if (!req->id) return;
    uint32_t slot = (uint32_t)req->id;
    ctx->ids[slot] = NULL;
    ctx->id_gen[slot]++;
    if (ctx->id_gen[slot] == 0) ctx->id_gen[slot] = 1;
    ctx->id_free[ctx->n_free++] = slot;
    req->id = 0;
}

void req_complete(slime_req_t *req, slime_status_t st, const char *fmt, ...) {
    if (req_done(req)) return;
    slime_ctx_t *ctx = req->ctx;
    if (st != SLIME_OK && fmt && !req->error) {
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&req->error, fmt, ap) < 0) req->error = NULL;
        va_end(ap);
    }
    list_del(&req->qlink);
    list_del(&req->eplink);
    req_id_release(ctx, req);
    if (req->local_mr) {
        atomic_fetch_sub(&req->local_mr->local_users, 1);
        req->local_mr = NULL;
    }
    slime_req_t *parent = req->parent;
    if (parent) {
        if (st != SLIME_OK && parent->first_err == SLIME_OK) {
            parent->first_err = st;
            parent->error = strdup(req->error ? req->error : slime_strerror(st));
        }
    }
    bool detached = req->detached;
    enum req_kind kind = req->kind;
    if (req->cb) {
        /* run by the progress thread, outside the lock */
        list_push_back(&ctx->callbacks, &req->cblink);
        ctx_post_work(ctx);
    }
    /* release, not seq_cst: ctx_wake orders it before its look at the
     * sleepers (wake_fence.c), which is all a sleeper needs; a locked
     * store on every completion cost 8-byte send/recv ~8 ns */
    atomic_store_explicit(&req->state, st, memory_order_release);
    if (detached && !req->cb) req_destroy(req); /* else after its callback */
    if (parent && --parent->children_left == 0) req_complete(parent, parent->first_err, NULL);
    ctx_wake(ctx, kind == REQ_WORKER);
}

static bool pred_done(void *arg) { return req_done(arg); }

/* Nobody will wait on req: if a worker thread owes it work not started,
 * that work must not wait for a waiter (p2p_run_here_fn, P2P_NO_WAITER). */
static void worker_hand_over(slime_req_t *req) {
    if (req->kind == REQ_WORKER && req->run_here && !req_done(req))
        req->run_here(req, req->run_here_arg, P2P_NO_WAITER);
}

static bool wait_req(slime_req_t *req, int64_t timeout_ms) {
    if (req->kind != REQ_WORKER) return ctx_wait_until(req->ctx, pred_done, req, deadline_after_ms(timeout_ms));
    /* work not yet started is done here: no hand-off to another thread
     * and back (collectives, coll/worker.c), and no clock read for a
     * deadline that only a sleep needs */
    if (req->run_here && req->run_here(req, req->run_here_arg, timeout_ms)) return true;
    return ctx_sleep_until(req->ctx, pred_done, req, deadline_after_ms(timeout_ms));
}

static slime_status_t final_status(slime_req_t *req) {
    slime_status_t st = atomic_load_explicit(&req->state, memory_order_acquire);
    if (st != SLIME_OK) slime_errorf(st, "%s", req->error ? req->error : slime_strerror(st));
    return st;
}

slime_status_t slime_req_test(slime_req_t *req) {
    if (!req) return slime_errorf(SLIME_ERR_INVAL, "req_test: NULL request");
    /* a done request's context may be gone (it may outlive it) */
    if (req_done(req)) return final_status(req);
    slime_ctx_t *ctx = req->ctx;
    /* a test is a look for work, as a wait is: a doorbell is moot */
    ctx_extend_grace(ctx);
    if (pthread_mutex_trylock(&ctx->lock) == 0) {
        progress_locked(ctx);
        pthread_mutex_unlock(&ctx->lock);
    }
    return req_done(req) ? final_status(req) : SLIME_INPROGRESS;
}

slime_status_t slime_req_wait(slime_req_t *req, int64_t timeout_ms) {
    if (!req) return slime_errorf(SLIME_ERR_INVAL, "req_wait: NULL request");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "req_wait: negative timeout");
    if (!req_done(req) && !wait_req(req, timeout_ms))
        return slime_errorf(SLIME_ERR_TIMEOUT, "request still pending after %lld ms", (long long)timeout_ms);
    return final_status(req);
}

struct all_arg {
    slime_req_t *const *reqs;
    size_t n, next;
};

static bool pred_all(void *arg) {
    struct all_arg *a = arg;
    while (a->next < a->n && req_done(a->reqs[a->next])) a->next++;
    return a->next == a->n;
}

slime_status_t slime_req_wait_all(slime_req_t *const *reqs, size_t n, int64_t timeout_ms) {
    if (n && !reqs) return slime_errorf(SLIME_ERR_INVAL, "req_wait_all: NULL array");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "req_wait_all: negative timeout");
    for (size_t i = 0; i < n; i++)
        if (!reqs[i]) return slime_errorf(SLIME_ERR_INVAL, "req_wait_all: request %zu is NULL", i);
    struct all_arg a = {reqs, n, 0};
    if (n && !pred_all(&a) &&
        !ctx_wait_until(reqs[0]->ctx, pred_all, &a, deadline_after_ms(timeout_ms)))
        return slime_errorf(SLIME_ERR_TIMEOUT, "%zu of %zu requests still pending after %lld ms", n - a.next, n,
                            (long long)timeout_ms);
    for (size_t i = 0; i < n; i++)
        if (atomic_load(&reqs[i]->state) != SLIME_OK) {
            slime_status_t st = final_status(reqs[i]);
            slime_errorf(st, "request %zu: %s", i, reqs[i]->error ? reqs[i]->error : slime_strerror(st));
            return st;
        }
    return SLIME_OK;
}

/* Under ctx->lock: a receive still in the posted list, or an imm_recv
 * still waiting, has not matched anything and can go. */
static bool cancel_locked(slime_req_t *req) {
    if ((req->kind == REQ_RECV || req->kind == REQ_IMM_RECV) && list_linked(&req->qlink)) {
        req_complete(req, SLIME_ERR_CANCELED, "request canceled");
        return true;
    }
    return false;
}

slime_status_t slime_req_cancel(slime_req_t *req) {
    if (!req) return slime_errorf(SLIME_ERR_INVAL, "req_cancel: NULL request");
    if (req_done(req)) return slime_errorf(SLIME_ERR_BUSY, "req_cancel: request already completed");
    pthread_mutex_lock(&req->ctx->lock);
    bool ok = cancel_locked(req);
    pthread_mutex_unlock(&req->ctx->lock);
    return ok ? SLIME_OK : slime_errorf(SLIME_ERR_BUSY, "req_cancel: request is already moving data; wait for it");
}

void slime_req_free(slime_req_t *req) {
    if (!req) return;
    worker_hand_over(req);
    if (req->cb) {
        /* its callback may still be due: the progress thread frees it */
        slime_ctx_t *ctx = req->ctx;
        pthread_mutex_lock(&ctx->lock);
        bool due = !req_done(req) || list_linked(&req->cblink) || req->cb_running;
        if (due && !req_done(req)) cancel_locked(req);
        if (due && (!req_done(req) || list_linked(&req->cblink) || req->cb_running)) {
            req->detached = true;
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
        pthread_mutex_unlock(&ctx->lock);
        req_destroy(req);
        return;
    }
    if (!req_done(req)) {
        slime_ctx_t *ctx = req->ctx;
        pthread_mutex_lock(&ctx->lock);
        if (!req_done(req) && !cancel_locked(req)) {
            req->detached = true; /* the core frees it when it completes */
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
        pthread_mutex_unlock(&ctx->lock);
    }
    req_destroy(req);
}

const char *slime_req_error(const slime_req_t *req) {
    if (!req || !req_done(req) || atomic_load(&req->state) == SLIME_OK) return "";
    return req->error ? req->error : slime_strerror(atomic_load(&req->state));
}
size_t slime_req_bytes(const slime_req_t *req) { return req ? req->bytes : 0; }
uint32_t slime_req_imm(const slime_req_t *req) { return req ? req->imm : 0; }
slime_ep_t *slime_req_ep(const slime_req_t *req) { return req ? req->ep : NULL; }

slime_status_t slime_req_on_complete(slime_req_t *req, slime_req_cb_t cb, void *arg) {
    if (!req || !cb) return slime_errorf(SLIME_ERR_INVAL, "req_on_complete: NULL argument");
    slime_ctx_t *ctx = req->ctx;
    bool now = false;
    /* before arming: once armed, the callback may free req at any time */
    worker_hand_over(req);
    if (!req_done(req)) {
        pthread_mutex_lock(&ctx->lock);
        if (req->cb) {
            pthread_mutex_unlock(&ctx->lock);
            return slime_errorf(SLIME_ERR_BUSY, "req_on_complete: the request has a callback already");
        }
        now = req_done(req);
        if (!now) {
            req->cb = cb;
            req->cb_arg = arg;
        }
        pthread_mutex_unlock(&ctx->lock);
    } else {
        now = true;
    }
    if (now) cb(req, arg);
    return SLIME_OK;
}

void run_callbacks(slime_ctx_t *ctx) {
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        slime_req_t *r = list_first(&ctx->callbacks, slime_req_t, cblink);
        if (r) {
            list_del(&r->cblink);
            r->cb_running = true;
        }
        pthread_mutex_unlock(&ctx->lock);
        if (!r) return;
        r->cb(r, r->cb_arg);
        pthread_mutex_lock(&ctx->lock);
        bool detached = r->detached;
        r->cb = NULL; /* ran: slime_req_free may free it outright now */
        r->cb_running = false;
        pthread_mutex_unlock(&ctx->lock);
        if (detached) req_destroy(r);
    }
}
