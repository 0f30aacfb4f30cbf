/* Peer liveness: finding a peer that is there but no longer answers.
 *
 * A peer that dies closes its connections and we see it at once.  One
 * that is stopped (SIGSTOP, a debugger) or hung keeps them open: without
 * this, whoever waits on it waits for its own timeout.  So while an
 * operation of ours needs the peer's progress engine (a receive from it, a
 * send it must take or answer, a one-sided op its engine serves, an
 * immediate it must send) or a layer above waits on it where the core sees
 * no request (a shared box: p2p_ep_wait_begin), and nothing has come from
 * the peer for a
 * quarter of the silence limit, we ping it; its progress thread answers,
 * whatever its Python threads are doing.  Still nothing when the silence
 * limit (DLSLIME_PEER_SILENCE_MS) is up: the endpoint fails with
 * SLIME_ERR_PEER_LOST, which fails every operation on it.
 *
 * Operations that complete without the peer's CPU never count as waiting
 * on it: one-sided ops the initiator copies (shm by CMA) or its device
 * does (verbs RDMA), and rendezvous data fetched that way; but a verbs
 * op's first use of a region asks the owner's engine for its key, and
 * that counts (transport waits_on_peer).  They keep
 * working against a stopped process, as they should.
 *
 * The hot path pays one increment per batch of bytes moved (ep->heard);
 * the look runs on the progress thread, a few times per silence limit,
 * and only while some endpoint waits on its peer.  Three things keep a
 * live but slow peer from being declared dead: a ping queued behind
 * outgoing data counts the data's progress as the peer's (it is reading);
 * a peer that holds back from reading us (no room for unexpected
 * messages) tells us it is there, unasked; and a look that comes late,
 * because this process was starved of CPU, restarts every clock instead
 * of blaming peers for our own delay. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "core/internal.h"
#include "transport/transport.h"

#define SILENCE_DEFAULT_MS 1000ull
#define TICKS_PER_SILENCE 8 /* looks per silence limit while waiting */
#define PING_AFTER 4        /* ping after silence / PING_AFTER quiet */

slime_status_t live_silence_env(uint64_t *silence_ns) {
    const char *v = getenv("DLSLIME_PEER_SILENCE_MS");
    *silence_ns = SILENCE_DEFAULT_MS * 1000000ull;
    if (!v || !*v) return SLIME_OK;
    char *end;
    errno = 0;
    unsigned long long ms = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-' || ms > 86400000ull)
        return slime_errorf(SLIME_ERR_INVAL,
                            "DLSLIME_PEER_SILENCE_MS=%s: expected milliseconds up to a day (0: never)", v);
    *silence_ns = ms * 1000000ull;
    return SLIME_OK;
}

static void send_live_frame(slime_ep_t *ep, uint8_t type) {
    txn_t *t = txn_new(type, 0);
    if (!t) { ep_fail(ep, SLIME_ERR_NOMEM, "out of memory for a liveness frame"); return; }
    if (type == F_PING) ep->ping_queued = true;
    frames_queue(ep, t);
    frames_flush(ep);
}

/* Pings and pongs carry nothing: a frame with anything in it is malformed. */
static bool empty_frame(const frame_t *h) {
    return !(h->flags | h->u32 | h->rkey) && !(h->a | h->b | h->c | h->d | h->len);
}

bool live_on_ping(slime_ep_t *ep, const frame_t *h) {
    if (!empty_frame(h)) return false;
    send_live_frame(ep, F_PONG);
    return true;
}

bool live_on_pong(slime_ep_t *ep, const frame_t *h) {
    (void)ep; /* frames_rx counts every frame heard: nothing more to do */
    return empty_frame(h);
}

/* Whether req needs the peer's progress engine to complete. */
static bool needs_peer(const slime_ep_t *ep, const slime_req_t *r) {
    switch (r->kind) {
    case REQ_SEND: return true;
    /* posted, answered by CTS, or landing from the stream now (not a
     * transport's own fetch of the sender's memory) */
    case REQ_RECV: return list_linked(&r->qlink) || r->id || ep->rx.req == r;
    /* served by the peer's engine: those that went as frames */
    case REQ_READ: case REQ_WRITE: return r->id != 0;
    default: return false;
    }
}

static bool waits_on_peer(slime_ep_t *ep) {
    if (!list_empty(&ep->imm_waiters) || atomic_load(&ep->outside_waits)) return true;
    if (ep->tp->waits_on_peer && ep->tp->waits_on_peer(ep)) return true;
    for (const slime_list_t *pos = ep->pending.next; pos != &ep->pending; pos = pos->next)
        if (needs_peer(ep, container_of(pos, slime_req_t, eplink))) return true;
    return false;
}

/* One endpoint's look; whether it waits on its peer, or holds back. */
static bool look(slime_ctx_t *ctx, slime_ep_t *ep, uint64_t now, bool late) {
    uint64_t silence = ctx->silence_ns;
    if (ep->state != EP_UP) return false;
    /* we hold back from reading the peer: say we are there all the same */
    bool held_back = rx_held_back(&ep->rx);
    if (held_back && now - ep->told_ns >= silence / PING_AFTER) {
        ep->told_ns = now;
        send_live_frame(ep, F_PONG);
    }
    if (ep->state != EP_UP || !waits_on_peer(ep)) {
        ep->quiet_since = 0;
        return ep->state == EP_UP && held_back;
    }
    if (ep->heard != ep->heard_seen || !ep->quiet_since || late) {
        ep->heard_seen = ep->heard;
        ep->quiet_since = now;
        ep->pinged = false;
        return true;
    }
    uint64_t quiet = now - ep->quiet_since;
    if (!ep->pinged && quiet >= silence / PING_AFTER) {
        ep->pinged = true;
        atomic_fetch_add(&ctx->live_pings, 1);
        send_live_frame(ep, F_PING);
    } else if (ep->pinged && quiet >= silence) {
        ep_fail(ep, SLIME_ERR_PEER_LOST,
                "peer stopped answering (stopped or hung): silent for %" PRIu64 " ms, no answer to a ping "
                "(DLSLIME_PEER_SILENCE_MS=%" PRIu64 ")",
                quiet / 1000000u, silence / 1000000u);
    }
    return true;
}

void live_check(slime_ctx_t *ctx, uint64_t now) {
    if (!ctx->silence_ns) {
        ctx->live_next_ns = UINT64_MAX;
        return;
    }
    /* a look this late means we were not running: our delay, not theirs */
    bool late = ctx->live_armed && now - ctx->live_last_ns > ctx->silence_ns / 2;
    ctx->live_last_ns = now;
    ctx->live_next_ns = now + ctx->silence_ns / TICKS_PER_SILENCE;
    bool armed = false;
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ctx->eps) armed |= look(ctx, container_of(pos, slime_ep_t, link), now, late);
    ctx->live_armed = armed;
}

int live_sleep_ms(slime_ctx_t *ctx, int ms) {
    if (!ctx->silence_ns) return ms;
    /* an operation posted since the last look may wait on a peer: look
     * again when due, not after a long sleep */
    bool soon = ctx->live_armed;
    slime_list_t *pos;
    for (pos = ctx->eps.next; pos != &ctx->eps && !soon; pos = pos->next) {
        slime_ep_t *ep = container_of(pos, slime_ep_t, link);
        soon = ep->state == EP_UP &&
               (!list_empty(&ep->pending) || !list_empty(&ep->imm_waiters) || rx_held_back(&ep->rx) ||
                atomic_load(&ep->outside_waits));
    }
    if (!soon) return ms;
    uint64_t t = now_ns();
    uint64_t left = ctx->live_next_ns > t ? (ctx->live_next_ns - t + 999999u) / 1000000u : 0;
    return left < (uint64_t)ms ? (int)left : ms;
}
