/* The handshake: a dialer sends a hello (magic, wire version, token
 * proof, its id and the secret behind it); the acceptor answers with a welcome carrying its verdict.
 * The hello proves the dialer's id by the secret the id is a digest of
 * (token.c), so no token holder can take another context's id.
 * The acceptor's half runs in the progress engine on non-blocking sockets,
 * so a stranger that sends garbage, or nothing, never stalls the listener:
 * bad bytes close the connection at once, silence after a deadline.
 * The hello names the dialer's transport: the listener's transport reads
 * it, and hands the connection on to the named one where that one dials
 * through this listener (transport_ops_t.via) and is open here. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core/internal.h"
#include "transport/transport.h"

/* Unauthenticated connections held at once (DLSLIME_PENDING_MAX); past
 * it the oldest goes.  A genuine dialer's hello follows its connect at
 * once, so only a silent connection grows old, and a flood of them costs
 * us this many fds at most, not one each until its deadline. */
#define PENDING_MAX 64

void hello_fill(const slime_ctx_t *ctx, const wire_addr_t *peer, int transport, wire_hello_t *h) {
    memset(h, 0, sizeof *h);
    h->magic = WIRE_HELLO_MAGIC;
    h->version = SLIME_WIRE_VERSION;
    h->transport = (uint8_t)transport;
    h->proof = peer->flags & ADDR_CAPABILITY ? peer->cap_proof : ctx->proof;
    h->ctx_id = ctx->id;
    h->pid = ctx->addr.pid;
    h->job = ctx->job;
    memcpy(h->id_secret, ctx->id_secret, sizeof h->id_secret);
}

slime_status_t welcome_check(const slime_ctx_t *ctx, const wire_welcome_t *w) {
    (void)ctx;
    if (w->magic != WIRE_WELCOME_MAGIC)
        return slime_errorf(SLIME_ERR_PROTOCOL, "handshake: the peer's reply is not a dlslime welcome");
    if (w->version != SLIME_WIRE_VERSION)
        return slime_errorf(SLIME_ERR_REFUSED, "handshake: peer speaks wire version %u, we speak %u",
                            w->version, SLIME_WIRE_VERSION);
    if (w->verdict == WELCOME_REFUSED)
        return slime_errorf(SLIME_ERR_REFUSED, "peer refused the connection: %.*s",
                            (int)sizeof w->reason, w->reason);
    return SLIME_OK;
}

static slime_ep_t *refuse(wire_welcome_t *w, uint16_t verdict, const char *why) {
    w->verdict = verdict;
    snprintf(w->reason, sizeof w->reason, "%s", why);
    return NULL;
}

/* Refuses a hello whose transport did not take the connection over. */
static slime_ep_t *refuse_transport(const slime_ctx_t *ctx, wire_welcome_t *w, unsigned wanted) {
    char why[96];
    const transport_ops_t *tp = NULL;
    for (size_t i = 0; slime_transports[i] && !tp; i++)
        if (slime_transports[i]->wire == (int)wanted) tp = slime_transports[i];
    if (!tp) snprintf(why, sizeof why, "transport %u is unknown here", wanted);
    else if (ctx_tp(ctx, wanted)) snprintf(why, sizeof why, "%s does not dial this listener", tp->name);
    else snprintf(why, sizeof why, "%s: this context %s", tp->name, tp->absent);
    return refuse(w, WELCOME_REFUSED, why);
}

slime_ep_t *hello_accept(slime_ctx_t *ctx, const wire_hello_t *h, int transport, wire_welcome_t *w) {
    memset(w, 0, sizeof *w);
    w->magic = WIRE_WELCOME_MAGIC;
    w->version = SLIME_WIRE_VERSION;
    w->ctx_id = ctx->id;
    w->pid = ctx->addr.pid;
    if (h->version != SLIME_WIRE_VERSION) {
        char why[96];
        snprintf(why, sizeof why, "wire version %u is not ours (%u)", h->version, SLIME_WIRE_VERSION);
        return refuse(w, WELCOME_REFUSED, why);
    }
    if (h->proof != ctx->proof) return refuse(w, WELCOME_REFUSED, "job token mismatch");
    if (ctx->force && h->transport != ctx->force)
        return refuse(w, WELCOME_REFUSED, "transport not allowed: this context is forced to another one");
    if (h->ctx_id == ctx->id) return refuse(w, WELCOME_REFUSED, "a context cannot connect to itself");
    if (context_id(h->id_secret) != h->ctx_id) {
        char why[96];
        snprintf(why, sizeof why, "context id %016" PRIx64 " is not the dialer's (no proof of it)", h->ctx_id);
        return refuse(w, WELCOME_REFUSED, why);
    }
    if (h->transport != transport) return refuse_transport(ctx, w, h->transport);
    slime_ep_t *ep = ep_find(ctx, h->ctx_id);
    if (!ep) {
        ep = ep_new(ctx, h->ctx_id);
        if (!ep) return refuse(w, WELCOME_REFUSED, "out of memory");
        ep->peer_job = h->job;
        return ep;
    }
    if (ep->state == EP_UP) return refuse(w, WELCOME_DUPLICATE, "already connected");
    /* both sides dial at once: the dial of the lower id wins */
    if (ep->dialing && h->ctx_id > ctx->id) return refuse(w, WELCOME_DUPLICATE, "our dial wins");
    ep->peer_job = h->job;
    return ep;
}

size_t pending_conn_evict(slime_ctx_t *ctx, size_t n) {
    size_t k = 0;
    pending_conn_t *oldest;
    while (k < n && (oldest = list_first(&ctx->pending_conns, pending_conn_t, link))) {
        pending_conn_close(ctx, oldest);
        k++;
    }
    return k;
}

void pending_conn_add(slime_ctx_t *ctx, int fd, int transport) {
    if (ctx->n_pending >= env_size("DLSLIME_PENDING_MAX", PENDING_MAX)) pending_conn_evict(ctx, 1);
    pending_conn_t *pc = calloc(1, sizeof *pc);
    if (!pc) { close(fd); return; }
    pc->fd = fd;
    pc->tp = ctx_tp(ctx, (unsigned)transport);
    pc->xfd[0] = pc->xfd[1] = -1;
    pc->deadline_ns = now_ns() + env_size("DLSLIME_HANDSHAKE_TIMEOUT_MS", 5000) * 1000000ull;
    pc->pollable.kind = POLL_PENDING;
    pc->pollable.obj = pc;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &pc->pollable};
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) { close(fd); free(pc); return; }
    list_push_back(&ctx->pending_conns, &pc->link);
    ctx->n_pending++;
    pending_conn_progress(ctx, pc); /* the hello may be here already */
}

void pending_conn_close(slime_ctx_t *ctx, pending_conn_t *pc) {
    if (pc->fd >= 0) {
        epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, pc->fd, NULL);
        close(pc->fd);
    }
    for (int i = 0; i < 2; i++)
        if (pc->xfd[i] >= 0) close(pc->xfd[i]);
    list_del(&pc->link);
    ctx->n_pending--;
    free(pc);
}

/* Reads the hello, and what follows it for the transport it names when
 * that one dials through this listener (its handshake info): 1 when all
 * is in, 0 when more is needed, -1 for a stranger. */
static int pending_read(slime_ctx_t *ctx, pending_conn_t *pc) {
    int r = pc->tp->read_hello(ctx, pc);
    if (r != 1 || pc->hello.transport == pc->tp->wire) return r;
    const transport_ops_t *named = ctx_tp(ctx, pc->hello.transport);
    if (!named || named->via != pc->tp->wire) return r; /* hello_accept refuses it */
    pc->tp = named;
    return named->read_hello(ctx, pc);
}

void pending_conn_progress(slime_ctx_t *ctx, pending_conn_t *pc) {
    int r = pending_read(ctx, pc);
    if (r == 0) return;
    if (r < 0) { pending_conn_close(ctx, pc); return; } /* a stranger: drop it */
    const transport_ops_t *tp = pc->tp;
    wire_welcome_t w;
    slime_ep_t *ep = hello_accept(ctx, &pc->hello, tp->wire, &w);
    if (!ep) {
        tp->send_welcome(ctx, pc, &w, NULL);
        pending_conn_close(ctx, pc);
        return;
    }
    void *conn = NULL;
    if (tp->send_welcome(ctx, pc, &w, &conn) != SLIME_OK) {
        if (ep->state == EP_CONNECTING && !ep->dialing) ep->state = EP_DOWN;
        pending_conn_close(ctx, pc);
        return;
    }
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, pc->fd, NULL);
    uint32_t pid = pc->peer_pid ? pc->peer_pid : pc->hello.pid;
    int fd = tp->conn_fd ? tp->conn_fd(conn) : pc->fd;
    pc->fd = -1; /* the endpoint (or its conn) owns it now */
    ep_attach(ep, tp, conn, fd, pid);
    list_push_back(&ctx->accepted, &ep->acceptq);
    pending_conn_close(ctx, pc);
}

int pending_conn_expire(slime_ctx_t *ctx) {
    int left = 0;
    uint64_t now = now_ns();
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->pending_conns) {
        pending_conn_t *pc = container_of(pos, pending_conn_t, link);
        if (now >= pc->deadline_ns) pending_conn_close(ctx, pc);
        else left++;
    }
    return left;
}
