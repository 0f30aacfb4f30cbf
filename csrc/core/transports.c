/* A context's transports: those of the provider table that serve it,
 * each with its state, and the choice of one per peer.  The core names
 * none of them; it asks their tables (transport/transport.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "core/internal.h"
#include "transport/transport.h"

slime_status_t transports_parse(const char *name, int *force) {
    *force = 0;
    if (!name || !*name || strcmp(name, "auto") == 0) return SLIME_OK;
    char known[160] = "auto";
    for (size_t i = 0; slime_transports[i]; i++) {
        const transport_ops_t *tp = slime_transports[i];
        if (strcmp(name, tp->name) == 0) {
            *force = tp->wire;
            return SLIME_OK;
        }
        size_t at = strlen(known);
        snprintf(known + at, sizeof known - at, "%s%s", slime_transports[i + 1] ? ", " : " or ", tp->name);
    }
    return slime_errorf(SLIME_ERR_INVAL, "unknown transport '%s' (expected %s)", name, known);
}

/* The context's copy of a table: the fields past the size it was built
 * with read as NULL, so the core may call an optional op it lacks. */
static transport_ops_t *table_copy(const transport_ops_t *tp) {
    transport_ops_t *t = calloc(1, sizeof *t);
    if (t) memcpy(t, tp, tp->size < sizeof *t ? tp->size : sizeof *t);
    return t;
}

static bool wire_id_taken(size_t i) {
    for (size_t j = 0; j < i; j++)
        if (slime_transports[j]->wire == slime_transports[i]->wire) return true;
    return false;
}

/* Opens the i-th transport of the provider table in ctx, if it serves it. */
static slime_status_t open_one(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, size_t i) {
    const transport_ops_t *tp = slime_transports[i];
    if (tp->wire <= 0 || tp->wire >= TRANSPORT_MAX || wire_id_taken(i) || !tp->ctx_open)
        return slime_errorf(SLIME_ERR_INVAL, "transport %s: bad provider table entry", tp->name);
    enum tp_mode mode = !ctx->force ? TP_AUTO : ctx->force == tp->wire ? TP_FORCED : TP_OTHER_FORCED;
    void *state = NULL;
    slime_status_t st = tp->ctx_open(ctx, opts, mode, &state);
    if (st != SLIME_OK) return st;
    if (!state)
        return mode == TP_FORCED ? slime_errorf(SLIME_ERR_UNSUPPORTED, "transport '%s' is not usable here", tp->name)
                                 : SLIME_OK;
    transport_ops_t *t = table_copy(tp);
    if (!t) {
        tp->ctx_close(state);
        return slime_errorf(SLIME_ERR_NOMEM, "transport %s", tp->name);
    }
    tp_slot_t *s = &ctx->tps[tp->wire];
    s->tp = t;
    s->state = state;
    s->eager = t->eager_env ? env_size(t->eager_env, t->eager_default) : t->eager_default;
    if (t->address) t->address(state, &ctx->addr);
    if (t->listen_fd) {
        s->listen.kind = POLL_LISTEN;
        s->listen.obj = s;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listen};
        epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, t->listen_fd(state), &ev);
    }
    return SLIME_OK;
}

slime_status_t transports_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts) {
    for (size_t i = 0; slime_transports[i]; i++) {
        slime_status_t st = open_one(ctx, opts, i);
        if (st != SLIME_OK) {
            transports_close(ctx);
            return st;
        }
    }
    return SLIME_OK;
}

/* A listener rests this long when its accept ran out of fds or memory
 * with no unauthenticated connection left to drop for room: its backlog
 * stays readable, and level-triggered epoll would wake us at once, again
 * and again, a core spent for nothing while fds are short.  Dialers wait
 * in the kernel's backlog meanwhile. */
#define LISTEN_REST_NS (100ull * 1000000ull)

static void listen_arm(slime_ctx_t *ctx, tp_slot_t *s, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = &s->listen};
    epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, s->tp->listen_fd(s->state), &ev);
}

void transports_accept(slime_ctx_t *ctx, tp_slot_t *s) {
    if (s->rest_until || s->tp->accept(ctx, s->state)) return;
    listen_arm(ctx, s, 0);
    s->rest_until = now_ns() + LISTEN_REST_NS;
    ctx->n_resting++;
}

void transports_wake_listeners(slime_ctx_t *ctx) {
    uint64_t now = now_ns();
    for (int id = 0; id < TRANSPORT_MAX; id++) {
        tp_slot_t *s = &ctx->tps[id];
        if (!s->rest_until || now < s->rest_until) continue;
        s->rest_until = 0;
        ctx->n_resting--;
        listen_arm(ctx, s, EPOLLIN);
    }
}

void transports_close(slime_ctx_t *ctx) {
    size_t n = 0;
    while (slime_transports[n]) n++;
    while (n--) { /* the reverse of the opening order */
        int id = slime_transports[n]->wire;
        tp_slot_t *s = id > 0 && id < TRANSPORT_MAX ? &ctx->tps[id] : NULL;
        if (!s || !s->tp) continue;
        s->tp->ctx_close(s->state); /* its listener leaves the epoll set with its fd */
        free((void *)s->tp);
        *s = (tp_slot_t){0};
    }
}

slime_status_t transports_choose(slime_ctx_t *ctx, const wire_addr_t *peer, const transport_ops_t **out) {
    if (ctx->force) {
        const tp_slot_t *s = &ctx->tps[ctx->force]; /* open, or the context would not exist */
        if (s->tp->reach(ctx, s->state, peer) == TP_REACH_NONE)
            return slime_errorf(SLIME_ERR_UNSUPPORTED, "connect: transport %s is forced but peer %016" PRIx64 " %s",
                                s->tp->name, peer->ctx_id, s->tp->absent);
        *out = s->tp;
        return SLIME_OK;
    }
    int best = TP_REACH_NONE;
    for (size_t i = 0; slime_transports[i]; i++) {
        const tp_slot_t *s = &ctx->tps[slime_transports[i]->wire];
        int r = s->tp ? s->tp->reach(ctx, s->state, peer) : TP_REACH_NONE;
        if (r > best) {
            best = r;
            *out = s->tp;
        }
    }
    if (best == TP_REACH_NONE)
        return slime_errorf(SLIME_ERR_UNSUPPORTED, "connect: no transport of this context reaches peer %016" PRIx64,
                            peer->ctx_id);
    return SLIME_OK;
}

uint64_t transports_counter(const slime_ctx_t *ctx, slime_counter_t which) {
    uint64_t n = 0;
    for (int id = 0; id < TRANSPORT_MAX; id++) {
        const tp_slot_t *s = &ctx->tps[id];
        if (s->tp && s->tp->counter) n += s->tp->counter(s->state, which);
    }
    return n;
}
