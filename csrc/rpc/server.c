/* The server: its mailbox, the hello, method checks, and handing calls
 * out to the threads waiting in slime_rpc_server_next. */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/lend.h"

/* Servers alive in this process, so that two of one context never share
 * a port (their mailboxes would steal each other's requests). */
static pthread_mutex_t servers_mu = PTHREAD_MUTEX_INITIALIZER;
static slime_list_t servers = {&servers, &servers};

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool method_known(const slime_rpc_server_t *srv, uint64_t id) {
    return bsearch(&id, srv->methods, srv->n_methods, sizeof id, cmp_u64) != NULL;
}

/* A following thread looks by itself this often: for requests that came
 * while the leader was busy with one (see wait_locked). */
#define FOLLOW_SLICE_NS 1000000ull

static uint64_t req_tag(const slime_rpc_server_t *srv) { return rpc_tag(RPC_TAG_REQ, srv->port); }

/* Under srv->mu: puts slot back at the tail of the mailbox, or frees it
 * when the server is closing or the post fails (the context closed). */
static void slot_repost_locked(slime_rpc_server_t *srv, rpc_slot_t *slot) {
    slime_req_free(slot->req);
    slot->req = NULL;
    if (!atomic_load(&srv->closing) &&
        rpc_slot_post(srv->ctx, NULL, slot, srv->opts.slot_size, req_tag(srv)) == SLIME_OK) {
        list_push_back(&srv->posted, &slot->link);
        return;
    }
    rpc_slot_free(slot);
    srv->n_slots--;
}

/* Under srv->mu: one more posted slot. */
static slime_status_t slot_add_locked(slime_rpc_server_t *srv) {
    rpc_slot_t *slot = calloc(1, sizeof *slot);
    if (slot) slot->buf = malloc(srv->opts.slot_size);
    if (!slot || !slot->buf) {
        free(slot);
        return slime_errorf(SLIME_ERR_NOMEM, "rpc server: out of memory for a slot");
    }
    slime_status_t st = rpc_slot_post(srv->ctx, NULL, slot, srv->opts.slot_size, req_tag(srv));
    if (st != SLIME_OK) {
        rpc_slot_free(slot);
        return st;
    }
    list_push_back(&srv->posted, &slot->link);
    srv->n_slots++;
    return SLIME_OK;
}

/* A header (and a short text payload) to a client's reply mailbox,
 * whose completion nobody waits for. */
static void send_small(slime_ep_t *ep, const rpc_hdr_t *h, const char *text, size_t text_len) {
    uint8_t *buf = malloc(RPC_HDR + text_len);
    if (!buf) return; /* the client times out */
    memcpy(buf, h, RPC_HDR);
    if (text_len) ((rpc_hdr_t *)buf)->len = text_len; /* (a lending HELLO_ACK says its limit there) */
    if (text_len) memcpy(buf + RPC_HDR, text, text_len);
    slime_req_t *req = NULL;
    if (slime_send(ep, buf, RPC_HDR + text_len, rpc_tag(RPC_TAG_REPLY, h->cid), &req) != SLIME_OK) {
        free(buf);
        return;
    }
    rpc_orphan_add(req, buf);
}

/* An error payload: "Type\0message\0traceback", as the Python layer
 * writes them.  The C layer's own errors are RpcError with no traceback. */
static void send_error(slime_ep_t *ep, uint32_t cid, uint64_t req_id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(slime_ep_t *ep, uint32_t cid, uint64_t req_id, const char *fmt, ...) {
    char text[400];
    int n = snprintf(text, sizeof text, "RpcError");
    va_list ap;
    va_start(ap, fmt);
    n += 1 + vsnprintf(text + n + 1, sizeof text - (size_t)n - 2, fmt, ap);
    va_end(ap);
    if ((size_t)n >= sizeof text - 1) n = (int)sizeof text - 2;
    text[n] = 0;
    rpc_hdr_t h;
    rpc_hdr_fill(&h, RPC_ERROR, cid);
    h.req_id = req_id;
    send_small(ep, &h, text, (size_t)n + 1);
}

static void answer_hello_locked(slime_rpc_server_t *srv, rpc_peer_t *peer, const rpc_hdr_t *in, const uint8_t *inl) {
    slime_ep_t *ep = peer->ep;
    if (in->version != SLIME_RPC_VERSION) {
        send_error(ep, in->cid, in->req_id, "RPC version mismatch: the client speaks %u, the server %u",
                   in->version, SLIME_RPC_VERSION);
        return;
    }
    if (in->method != srv->digest) {
        send_error(ep, in->cid, in->req_id,
                   "service definition mismatch at port %u: the client's digest is %016" PRIx64
                   ", the server's %016" PRIx64 " (method names or kinds differ)",
                   srv->port, in->method, srv->digest);
        return;
    }
    uint32_t credits = in->credits < srv->opts.credits ? in->credits : srv->opts.credits;
    if (credits == 0) credits = 1;
    srv->granted += credits;
    /* one slot per credit granted (and one for hellos), up to the cap */
    while (srv->n_slots < srv->granted + 1 && srv->n_slots < srv->opts.max_slots)
        if (slot_add_locked(srv) != SLIME_OK) break;
    rpc_hdr_t h;
    rpc_hdr_fill(&h, RPC_HELLO_ACK, in->cid);
    h.credits = credits;
    h.method = srv->digest;
    h.req_id = in->req_id;
    h.slot = srv->opts.slot_size;
    if (in->flags & RPC_F_LENT) { /* the client offers to lend: can we fetch its probe? */
        rpc_lend_t d;
        memcpy(&d, inl, sizeof d);
        char why[160];
        /* a probe that is a block to lend is mapped now, not by the first call */
        lend_map_t *m =
            d.size >= LEND_MIN ? lend_map_get_locked(peer, &d, 0, srv->bulk_budget, true, why, sizeof why) : NULL;
        if (m) lend_map_put_locked(peer, m);
        if (m || lend_probe_ok(ep->verified_pid, &d)) {
            h.flags |= RPC_F_LENT;
            h.len = srv->bulk_budget; /* the largest block it maps */
        }
    }
    send_small(ep, &h, NULL, 0);
}

static void call_free(slime_rpc_call_t *call) {
    free(call->prefix);
    slime_rpc_mem_free(call->owned);
    slime_rpc_mem_free(call->reply_stage);
    slime_rpc_mem_free(call->reply_bulk);
    free(call);
}

/* Under srv->mu; drops a reference; returns whether it was the last. */
static bool srv_unref_locked(slime_rpc_server_t *srv) { return --srv->refs == 0; }

static void peer_free(rpc_peer_t *p) {
    lend_maps_free(p);
    list_del(&p->link);
    ep_unref(p->ep); /* safe after the context's destroy too */
    free(p);
}

/* Under srv->mu: ep's entry, made (with a reference on ep) on its first
 * message; NULL without memory.  The latest to send moves to the front:
 * a busy peer is found at once among many idle ones. */
static rpc_peer_t *peer_get_locked(slime_rpc_server_t *srv, slime_ep_t *ep) {
    if (!ep) return NULL;
    rpc_peer_t *p = NULL;
    for (slime_list_t *pos = srv->peers.next; pos != &srv->peers && !p; pos = pos->next)
        if (container_of(pos, rpc_peer_t, link)->ep == ep) p = container_of(pos, rpc_peer_t, link);
    if (p) {
        list_del(&p->link);
    } else {
        p = calloc(1, sizeof *p);
        if (!p) return NULL;
        /* the receive that names ep holds a reference of its own, so the
         * core cannot be reaping ep while we take ours without its lock */
        ep_ref(ep);
        p->ep = ep;
        list_init(&p->maps);
    }
    list_push_back(srv->peers.next, &p->link); /* before the first */
    return p;
}

/* Under srv->mu: the peers that are gone with no call left are let go,
 * so that the core frees their endpoints.  One still in the context's
 * accept queue leaves it: accepting a dead RPC client's endpoint would
 * tell the application nothing, and keeping it there kept it forever. */
static void peers_sweep_locked(slime_rpc_server_t *srv) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->peers) {
        rpc_peer_t *p = container_of(pos, rpc_peer_t, link);
        if (p->calls || slime_ep_status(p->ep) == SLIME_OK) continue;
        pthread_mutex_lock(&srv->ctx->lock);
        list_del(&p->ep->acceptq);
        pthread_mutex_unlock(&srv->ctx->lock);
        peer_free(p);
    }
}

/* Under srv->mu: a call is over; returns whether the server's last
 * reference went with it. */
static bool call_end_locked(slime_rpc_server_t *srv, slime_rpc_call_t *call) {
    if (call->lent) lend_map_put_locked(call->peer, call->lent);
    call->lent = NULL;
    call->peer->calls--;
    return srv_unref_locked(srv);
}

static void srv_free(slime_rpc_server_t *srv) {
    while (!list_empty(&srv->peers)) peer_free(list_first(&srv->peers, rpc_peer_t, link));
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->follow_cond);
    free(srv->methods);
    free(srv);
}

/* ---- bulk payloads of requests, within each peer's budget ----
 *
 * A request announces its bulk payload's size before any of it arrives.
 * Reserving every announced size at once let a client that never sends
 * hold the server's memory (16 announcements of 8 GiB: 128 GiB), so the
 * bytes a peer announced that have not arrived stay within a budget
 * (DLSLIME_RPC_BULK_BUDGET, 4 GiB by default): a payload that does not
 * fit waits, unallocated, for the peer's earlier ones to arrive (a peer
 * with none in flight always has room).  A peer that announces more than
 * the whole budget at once, or stages more requests than any credits
 * allow, is disconnected with an error that names it. */
#define BULK_BUDGET_DEFAULT (4ull << 30)
#define PEER_STAGED_MAX SLIME_RPC_CREDITS_MAX

/* Under srv->mu: call leaves srv->staged, and its bytes (while its
 * receive is posted) its peer's budget. */
static void unstage_locked(slime_rpc_call_t *call) {
    rpc_peer_t *p = call->peer;
    list_del(&call->link);
    if (call->bulk_req) p->unreceived -= call->len;
    p->staged--;
}

/* Under srv->mu: a staged call is dropped (nobody to answer, or told). */
static void unstage_drop_locked(slime_rpc_server_t *srv, slime_rpc_call_t *call) {
    unstage_locked(call);
    slime_req_free(call->bulk_req);
    call->bulk_req = NULL;
    call_end_locked(srv, call); /* the server's own reference remains */
    call_free(call);
}

/* Under srv->mu: posts the receive of a staged call's payload if its
 * peer's budget has room (dropping the call, answered, if that fails). */
static void bulk_admit_locked(slime_rpc_server_t *srv, slime_rpc_call_t *call) {
    rpc_peer_t *p = call->peer;
    if (p->unreceived && call->len > srv->bulk_budget - p->unreceived) return; /* later */
    uint64_t tag = rpc_bulk_tag(RPC_TAG_BULK_REQ, call->cid, call->req_id);
    call->owned = rpc_mem_alloc(call->len);
    if (call->owned && call->head) memcpy(call->owned, call->prefix, call->head);
    free(call->prefix);
    call->prefix = NULL;
    if (!call->owned || slime_recv(call->ep, (uint8_t *)call->owned + call->head, call->len - call->head, tag,
                                   &call->bulk_req) != SLIME_OK) {
        send_error(call->ep, call->cid, call->req_id, "the server cannot take a %zu-byte payload",
                   call->len);
        unstage_drop_locked(srv, call);
        return;
    }
    p->unreceived += call->len;
    call->data = call->owned;
}

/* Under srv->mu: a request whose payload follows by bulk is staged. */
static void bulk_stage_locked(slime_rpc_server_t *srv, slime_rpc_call_t *call) {
    rpc_peer_t *p = call->peer;
    if (call->len > srv->bulk_budget || p->staged >= PEER_STAGED_MAX) {
        if (call->len > srv->bulk_budget)
            p2p_ep_fail(call->ep, SLIME_ERR_PROTOCOL,
                        "rpc: a request announced a %zu-byte payload, over the peer's budget of %" PRIu64
                        " bytes (DLSLIME_RPC_BULK_BUDGET)", call->len, srv->bulk_budget);
        else
            p2p_ep_fail(call->ep, SLIME_ERR_PROTOCOL,
                        "rpc: %u requests with bulk payloads staged at once, more than any credits allow",
                        p->staged + 1);
        call_end_locked(srv, call);
        call_free(call);
        return;
    }
    p->staged++;
    list_push_back(&srv->staged, &call->link);
    bulk_admit_locked(srv, call);
}

/* Under srv->mu: staged calls waiting for budget get it where it freed
 * up; those of a peer gone meanwhile are dropped. */
static void bulk_admit_waiting_locked(slime_rpc_server_t *srv) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->staged) {
        slime_rpc_call_t *call = container_of(pos, slime_rpc_call_t, link);
        if (call->bulk_req) continue;
        if (slime_ep_status(call->ep) != SLIME_OK) unstage_drop_locked(srv, call);
        else bulk_admit_locked(srv, call);
    }
}

/* Under srv->mu: a call whose payload the client lent (lend.h): read
 * in place from its block, mapped (or found mapped); the slot, which
 * held only the block's descriptor, goes back at once. */
static slime_rpc_call_t *take_lent_locked(slime_rpc_server_t *srv, rpc_slot_t *slot, slime_rpc_call_t *call) {
    rpc_lend_t d;
    memcpy(&d, slot->buf + RPC_HDR, sizeof d);
    slot_repost_locked(srv, slot);
    char why[200];
    call->lent = lend_map_get_locked(call->peer, &d, call->len, srv->bulk_budget, false, why, sizeof why);
    if (!call->lent) {
        send_error(call->ep, call->cid, call->req_id, "the server cannot read the lent payload: %s", why);
        call_end_locked(srv, call);
        call_free(call);
        return NULL;
    }
    call->data = lend_map_base(call->lent);
    return call;
}

/* Under srv->mu: a completed slot from the mailbox's head.  Returns a
 * call to hand out, or NULL when the slot was handled here. */
static slime_rpc_call_t *take_slot_locked(slime_rpc_server_t *srv, rpc_slot_t *slot) {
    slime_status_t st = atomic_load(&slot->req->state);
    if (st != SLIME_OK) {
        /* canceled (destroy) or failed with the context: the server is done */
        if (st == SLIME_ERR_CANCELED || st == SLIME_ERR_CLOSED) atomic_store(&srv->closing, true);
        slot_repost_locked(srv, slot);
        return NULL;
    }
    char why[160];
    const rpc_hdr_t *h = rpc_slot_header(slot, why, sizeof why);
    slime_ep_t *ep = slime_req_ep(slot->req);
    if (h && h->kind == RPC_HELLO) peers_sweep_locked(srv); /* one comes: let those gone go (before its own entry) */
    rpc_peer_t *peer = peer_get_locked(srv, ep);
    /* not ours to answer (or no memory to): nothing tells us where a reply would go */
    if (!h || !peer) {
        slot_repost_locked(srv, slot);
        return NULL;
    }
    if (h->kind == RPC_HELLO) {
        answer_hello_locked(srv, peer, h, slot->buf + RPC_HDR);
        slot_repost_locked(srv, slot);
        return NULL;
    }
    if (h->kind != RPC_REQUEST || h->version != SLIME_RPC_VERSION) {
        slot_repost_locked(srv, slot);
        return NULL;
    }
    if (!method_known(srv, h->method)) {
        send_error(ep, h->cid, h->req_id,
                   "unknown method id %016" PRIx64 " at port %u: not a method of the service served here",
                   h->method, srv->port);
        slot_repost_locked(srv, slot);
        return NULL;
    }
    slime_rpc_call_t *call = calloc(1, sizeof *call);
    if (!call) {
        send_error(ep, h->cid, h->req_id, "the server is out of memory");
        slot_repost_locked(srv, slot);
        return NULL;
    }
    call->srv = srv;
    list_init(&call->link);
    call->ep = ep;
    call->cid = h->cid;
    call->method = h->method;
    call->req_id = h->req_id;
    call->reply_inline = h->slot;
    call->len = h->len;
    call->peer = peer;
    peer->calls++;
    srv->refs++;
    if (h->flags & RPC_F_LENT) return take_lent_locked(srv, slot, call);
    if (!(h->flags & RPC_F_BULK)) {
        call->slot = slot;
        call->data = slot->buf + RPC_HDR;
        return call;
    }
    /* the payload follows by bulk: its inline head is kept aside, and its
     * slot can go back at once */
    call->head = h->head;
    call->prefix = call->head ? malloc(call->head) : NULL;
    if (call->head && !call->prefix) {
        send_error(ep, h->cid, h->req_id, "the server is out of memory");
        slot_repost_locked(srv, slot);
        call_end_locked(srv, call);
        call_free(call);
        return NULL;
    }
    if (call->head) memcpy(call->prefix, slot->buf + RPC_HDR, call->head);
    slot_repost_locked(srv, slot);
    bulk_stage_locked(srv, call);
    return NULL;
}

/* Under srv->mu: a staged call whose bulk payload has arrived. */
static slime_rpc_call_t *take_staged_locked(slime_rpc_server_t *srv) {
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->staged) {
        slime_rpc_call_t *call = container_of(pos, slime_rpc_call_t, link);
        if (!call->bulk_req || !req_done(call->bulk_req)) continue;
        if (atomic_load(&call->bulk_req->state) != SLIME_OK) {
            unstage_drop_locked(srv, call); /* the client is gone: nobody to answer */
            continue;
        }
        unstage_locked(call);
        slime_req_free(call->bulk_req);
        call->bulk_req = NULL;
        return call;
    }
    return NULL;
}

static bool head_done_locked(const slime_rpc_server_t *srv) {
    const rpc_slot_t *head = list_first(&srv->posted, rpc_slot_t, link);
    return head && req_done(head->req);
}

/* Under srv->mu: a request is there to take. */
static bool ready_locked(slime_rpc_server_t *srv) {
    bool ready = head_done_locked(srv);
    slime_list_t *pos;
    for (pos = srv->staged.next; !ready && pos != &srv->staged; pos = pos->next)
        ready = container_of(pos, slime_rpc_call_t, link)->bulk_req &&
                req_done(container_of(pos, slime_rpc_call_t, link)->bulk_req);
    return ready;
}

/* The wait predicate (see rpc_internal.h: look, never post or block). */
static bool server_ready(void *arg) {
    slime_rpc_server_t *srv = arg;
    if (atomic_load(&srv->closing)) return true;
    if (pthread_mutex_trylock(&srv->mu) != 0) return true;
    bool ready = ready_locked(srv);
    pthread_mutex_unlock(&srv->mu);
    return ready;
}

slime_status_t slime_rpc_server_create(slime_ctx_t *ctx, uint16_t port, uint64_t digest,
                                       const uint64_t *method_ids, size_t n, const slime_rpc_opts_t *opts,
                                       slime_rpc_server_t **out) {
    if (out) *out = NULL;
    if (!ctx || !out || (n && !method_ids))
        return slime_errorf(SLIME_ERR_INVAL, "rpc_server_create: NULL %s", !ctx ? "context" : !out ? "out" : "method ids");
    slime_rpc_opts_t o;
    slime_rpc_opts_init(&o);
    if (opts) o = *opts;
    if (o.slot_size < SLIME_RPC_SLOT_MIN)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_server_create: slot_size %zu is below %d", o.slot_size,
                            SLIME_RPC_SLOT_MIN);
    if (o.credits < 1 || o.credits > SLIME_RPC_CREDITS_MAX || o.max_slots < 1)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_server_create: credits %u (1..%d) or max_slots %u (>= 1)",
                            o.credits, SLIME_RPC_CREDITS_MAX, o.max_slots);
    rpc_mem_prime();
    slime_rpc_server_t *srv = calloc(1, sizeof *srv);
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!srv || !ids) {
        free(srv);
        free(ids);
        return slime_errorf(SLIME_ERR_NOMEM, "rpc_server_create: out of memory");
    }
    if (n) memcpy(ids, method_ids, n * sizeof *ids);
    qsort(ids, n, sizeof *ids, cmp_u64);
    srv->ctx = ctx;
    srv->port = port;
    srv->digest = digest;
    srv->methods = ids;
    srv->n_methods = n;
    srv->opts = o;
    pthread_mutex_init(&srv->mu, NULL);
    cond_init_monotonic(&srv->follow_cond);
    list_init(&srv->posted);
    list_init(&srv->staged);
    list_init(&srv->peers);
    srv->bulk_budget = env_size("DLSLIME_RPC_BULK_BUDGET", BULK_BUDGET_DEFAULT);
    atomic_init(&srv->closing, false);
    atomic_init(&srv->waiters, 0);
    srv->refs = 1;

    pthread_mutex_lock(&servers_mu);
    slime_list_t *pos;
    for (pos = servers.next; pos != &servers; pos = pos->next) {
        slime_rpc_server_t *s = container_of(pos, slime_rpc_server_t, link);
        if (s->ctx == ctx && s->port == port) {
            pthread_mutex_unlock(&servers_mu);
            srv_free(srv);
            return slime_errorf(SLIME_ERR_BUSY, "rpc_server_create: port %u of this context has a server already",
                                port);
        }
    }
    list_push_back(&servers, &srv->link);
    pthread_mutex_unlock(&servers_mu);

    /* slots for the hellos to land in; each hello adds its credits' worth */
    slime_status_t st = SLIME_OK;
    pthread_mutex_lock(&srv->mu);
    for (uint32_t i = 0; i < o.credits && i < o.max_slots && st == SLIME_OK; i++) st = slot_add_locked(srv);
    pthread_mutex_unlock(&srv->mu);
    if (st != SLIME_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", slime_last_error());
        slime_rpc_server_destroy(srv);
        return slime_errorf(st, "rpc_server_create: %s", why);
    }
    *out = srv;
    return SLIME_OK;
}

/* Under srv->mu: waits for the next request, or up to the deadline.
 * One waiter (the leader) waits in the core, spinning first; the others
 * sleep.  A spinner per worker thread took the cores the handlers and
 * callers need: a second idle thread made a 1 KiB call 1.7x slower on 2
 * cores.  Waking a follower each time the leader leaves with a call cost
 * as much (a wake-up per call), so the leader wakes one only when more
 * requests wait (hand_over_locked), and a follower looks by itself every
 * FOLLOW_SLICE_NS. */
static void wait_locked(slime_rpc_server_t *srv, uint64_t deadline) {
    if (srv->leading) {
        srv->following++;
        uint64_t until = now_ns() + FOLLOW_SLICE_NS;
        if (until > deadline) until = deadline;
        struct timespec ts = timespec_at_ns(until);
        pthread_cond_timedwait(&srv->follow_cond, &srv->mu, &ts);
        srv->following--;
        return;
    }
    srv->leading = true;
    pthread_mutex_unlock(&srv->mu);
    ctx_wait_until(srv->ctx, server_ready, srv, deadline);
    pthread_mutex_lock(&srv->mu);
    srv->leading = false;
}

/* Under srv->mu, leaving slime_rpc_server_next: while nobody leads, a
 * follower is woken to lead if a request waits still (took_call) or at
 * all (a timeout: the follower's own deadline may be later). */
static void hand_over_locked(slime_rpc_server_t *srv, bool took_call) {
    if (srv->following && !srv->leading && (!took_call || ready_locked(srv)))
        pthread_cond_signal(&srv->follow_cond);
}

slime_status_t slime_rpc_server_next(slime_rpc_server_t *srv, int64_t timeout_ms, slime_rpc_call_t **out) {
    if (out) *out = NULL;
    if (!srv || !out) return slime_errorf(SLIME_ERR_INVAL, "rpc_server_next: NULL %s", srv ? "out" : "server");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "rpc_server_next: negative timeout");
    uint64_t deadline = deadline_after_ms(timeout_ms);
    atomic_fetch_add(&srv->waiters, 1);
    slime_status_t st;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        if (atomic_load(&srv->ctx->closed)) atomic_store(&srv->closing, true);
        if (atomic_load(&srv->closing)) {
            st = SLIME_ERR_CLOSED;
            break;
        }
        bulk_admit_waiting_locked(srv);
        slime_rpc_call_t *call = take_staged_locked(srv);
        while (!call && head_done_locked(srv)) {
            rpc_slot_t *head = list_first(&srv->posted, rpc_slot_t, link);
            list_del(&head->link);
            call = take_slot_locked(srv, head);
        }
        if (call) {
            *out = call;
            st = SLIME_OK;
            hand_over_locked(srv, true);
            break;
        }
        if (now_ns() >= deadline) {
            st = SLIME_ERR_TIMEOUT;
            hand_over_locked(srv, false);
            break;
        }
        wait_locked(srv, deadline);
    }
    pthread_mutex_unlock(&srv->mu);
    atomic_fetch_sub(&srv->waiters, 1);
    if (st == SLIME_ERR_CLOSED) return slime_errorf(st, "rpc_server_next: the server is closed");
    if (st == SLIME_ERR_TIMEOUT)
        return slime_errorf(st, "rpc_server_next: no request within %lld ms", (long long)timeout_ms);
    return st;
}

void slime_rpc_server_shutdown(slime_rpc_server_t *srv) {
    if (!srv) return;
    pthread_mutex_lock(&servers_mu);
    list_del(&srv->link);
    pthread_mutex_unlock(&servers_mu);
    pthread_mutex_lock(&srv->mu);
    atomic_store(&srv->closing, true);
    pthread_cond_broadcast(&srv->follow_cond);
    /* canceling the slots completes their receives, which wakes the
     * waiters sleeping in the core; they see closing and leave */
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->posted) {
        rpc_slot_t *slot = container_of(pos, rpc_slot_t, link);
        list_del(&slot->link);
        rpc_slot_free(slot);
        srv->n_slots--;
    }
    list_for_each_safe(pos, tmp, &srv->staged) {
        slime_rpc_call_t *call = container_of(pos, slime_rpc_call_t, link);
        unstage_locked(call);
        /* a receive still posted is canceled; one moving data completes
         * into call->owned, so that memory goes with the request */
        slime_req_t *r = call->bulk_req;
        if (r && slime_req_cancel(r) != SLIME_OK && !req_done(r)) {
            rpc_orphan_add(r, call->owned);
            call->owned = NULL;
        } else {
            slime_req_free(r);
        }
        call_end_locked(srv, call);
        call_free(call);
    }
    pthread_mutex_unlock(&srv->mu);
}

void slime_rpc_server_destroy(slime_rpc_server_t *srv) {
    if (!srv) return;
    slime_rpc_server_shutdown(srv);
    while (atomic_load(&srv->waiters) > 0) sched_yield();
    pthread_mutex_lock(&srv->mu);
    bool last = srv_unref_locked(srv);
    pthread_mutex_unlock(&srv->mu);
    if (last) srv_free(srv);
}

/* ---- calls ---- */

uint64_t slime_rpc_call_method(const slime_rpc_call_t *call) { return call ? call->method : 0; }

const void *slime_rpc_call_data(const slime_rpc_call_t *call, size_t *len) {
    if (len) *len = call ? call->len : 0;
    return call ? call->data : NULL;
}

slime_ep_t *slime_rpc_call_ep(const slime_rpc_call_t *call) { return call ? call->ep : NULL; }

slime_status_t slime_rpc_call_detach(slime_rpc_call_t *call, void **mem) {
    if (!call || !mem) return slime_errorf(SLIME_ERR_INVAL, "rpc_call_detach: NULL argument");
    *mem = NULL;
    if (call->owned) {
        *mem = call->owned;
        call->owned = NULL;
        return SLIME_OK;
    }
    if (call->lent) { /* a view outlives the call: the mapping goes with it, and the client is told */
        pthread_mutex_lock(&call->srv->mu);
        *mem = lend_map_detach_locked(call->peer, call->lent);
        pthread_mutex_unlock(&call->srv->mu);
        if (!*mem) return slime_errorf(SLIME_ERR_NOMEM, "rpc_call_detach: out of memory");
        call->kept = true;
        return SLIME_OK;
    }
    if (!call->slot) return slime_errorf(SLIME_ERR_INVAL, "rpc_call_detach: the payload was detached already");
    uint8_t *fresh = malloc(call->srv->opts.slot_size);
    if (!fresh) return slime_errorf(SLIME_ERR_NOMEM, "rpc_call_detach: out of memory for a new slot");
    *mem = call->slot->buf;
    call->slot->buf = fresh;
    return SLIME_OK;
}

slime_status_t slime_rpc_call_reply_buffer(slime_rpc_call_t *call, size_t cap, void **buf) {
    if (!call || !buf) return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_buffer: NULL argument");
    *buf = NULL;
    if (call->reply_stage || call->reply_bulk)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_buffer: the call has a reply buffer already");
    if (RPC_HDR + cap <= call->reply_inline) {
        call->reply_stage = rpc_mem_alloc(RPC_HDR + cap);
        if (call->reply_stage) *buf = call->reply_stage + RPC_HDR;
    } else {
        call->reply_bulk = rpc_mem_alloc(cap);
        *buf = call->reply_bulk;
    }
    call->reply_cap = cap;
    return *buf ? SLIME_OK : slime_errorf(SLIME_ERR_NOMEM, "rpc_call_reply_buffer: out of memory for %zu bytes", cap);
}

/* Gives the call's slot back to the mailbox (once). */
static void release_slot(slime_rpc_call_t *call) {
    if (!call->slot) return;
    pthread_mutex_lock(&call->srv->mu);
    slot_repost_locked(call->srv, call->slot);
    call->slot = NULL;
    pthread_mutex_unlock(&call->srv->mu);
}

/* The answer's header and inline bytes: the reply buffer itself when the
 * reply was built there and rides inline, else a fresh copy (malloc'd). */
static uint8_t *answer_stage(slime_rpc_call_t *call, const rpc_parts_t *m, size_t head) {
    if (call->reply_stage && m->buf == call->reply_stage + RPC_HDR && head == rpc_parts_total(m)) {
        uint8_t *stage = call->reply_stage;
        call->reply_stage = NULL;
        return stage;
    }
    uint8_t *stage = malloc(RPC_HDR + head);
    if (stage) rpc_parts_copy(m, stage + RPC_HDR, head);
    return stage;
}

/* Finishes a call: sends the answer (kind, payload m), waits for it to
 * leave, gives the slot back, frees the call. */
/* Whether answer m goes back in the call's lent payload, which nobody
 * here views any more (not kept): its one part, or its tail with the
 * head riding inline (set in *head) to be put in front of the tail there
 * by the client.  *off: where that part starts in the payload. */
static bool answer_in_block(const slime_rpc_call_t *call, const rpc_parts_t *m, uint64_t *off, size_t *head) {
    if (!call->lent || call->kept) return false;
    const uint8_t *p = m->tail_len ? m->tail : m->buf;
    size_t n = m->tail_len ? m->tail_len : m->len;
    *head = m->tail_len ? m->len : 0;
    size_t room = call->reply_inline > RPC_HDR ? call->reply_inline - RPC_HDR : 0;
    if (!n || p < call->data || p > call->data + call->len || n > (size_t)(call->data + call->len - p)) return false;
    *off = (uint64_t)(p - call->data);
    return *head <= *off && *head <= room;
}

/* The answer's header, and how many of its bytes ride inline. */
static size_t answer_header(const slime_rpc_call_t *call, uint8_t kind, const rpc_parts_t *m, rpc_hdr_t *h) {
    size_t room = call->reply_inline > RPC_HDR ? call->reply_inline - RPC_HDR : 0;
    rpc_hdr_fill(h, kind, call->cid);
    h->req_id = call->req_id;
    h->len = rpc_parts_total(m);
    if (call->kept) h->flags |= RPC_F_KEPT;
    uint64_t off;
    size_t head;
    if (answer_in_block(call, m, &off, &head)) {
        h->flags |= RPC_F_LENT;
        h->off = off;
        h->head = (uint32_t)head;
        return head;
    }
    return rpc_parts_head(m, room);
}

static slime_status_t call_finish(slime_rpc_call_t *call, uint8_t kind, const rpc_parts_t *m, int64_t timeout_ms) {
    slime_rpc_server_t *srv = call->srv;
    size_t total = rpc_parts_total(m);
    rpc_hdr_t h;
    size_t head = answer_header(call, kind, m, &h);
    bool in_block = h.flags & RPC_F_LENT;
    slime_status_t st = SLIME_OK;
    slime_req_t *reqs[2] = {NULL, NULL};
    void *bulk_owned = NULL;
    const void *bulk = NULL;
    uint8_t *stage = answer_stage(call, m, head);
    if (stage && head < total && !in_block) {
        h.flags |= RPC_F_BULK;
        h.head = (uint32_t)head;
        bulk = rpc_parts_bulk(m, head, &bulk_owned);
        if (!bulk_owned && call->reply_bulk && bulk == call->reply_bulk) {
            bulk_owned = call->reply_bulk;
            call->reply_bulk = NULL;
        }
    }
    if (!stage || (head < total && !bulk && !in_block)) {
        st = slime_errorf(SLIME_ERR_NOMEM, "rpc reply: out of memory");
        goto out;
    }
    memcpy(stage, &h, RPC_HDR);
    /* An inline answer is copied by now (it may lie in the request's own
     * slot: an echo): the slot goes back before the reply leaves, so the
     * credit the reply returns finds it posted.  A bulk answer may be read
     * from the slot until it has left. */
    if (!bulk) release_slot(call);
    uint64_t tag = rpc_tag(RPC_TAG_REPLY, call->cid);
    st = slime_send(call->ep, stage, RPC_HDR + head, tag, &reqs[0]);
    if (st == SLIME_OK && bulk)
        st = slime_send(call->ep, bulk, total - head, rpc_bulk_tag(RPC_TAG_BULK_REPLY, call->cid, call->req_id),
                        &reqs[1]);
    if (st == SLIME_OK) st = slime_req_wait_all(reqs, bulk ? 2 : 1, timeout_ms);
    if (st == SLIME_ERR_TIMEOUT && reqs[1] && !bulk_owned && call->slot && (const uint8_t *)bulk >= call->slot->buf &&
        (const uint8_t *)bulk < call->slot->buf + srv->opts.slot_size) {
        /* the bulk may still read the slot's buffer: it goes with the
         * orphans below, and the slot gets a new one */
        void *mem = NULL;
        if (slime_rpc_call_detach(call, &mem) == SLIME_OK) bulk_owned = mem;
    }
    if (st == SLIME_ERR_TIMEOUT && reqs[1] && !bulk_owned && call->owned && (const uint8_t *)bulk >= call->data &&
        (const uint8_t *)bulk < call->data + call->len) {
        bulk_owned = call->owned; /* an echo of a bulk payload nobody views: it goes with the orphans */
        call->owned = NULL;
    }
    if (st == SLIME_ERR_TIMEOUT) {
        /* still queued: the buffers we own are freed once they left */
        rpc_orphan_add(reqs[0], stage);
        if (reqs[1]) rpc_orphan_add(reqs[1], bulk_owned);
        stage = NULL;
        bulk_owned = NULL;
        reqs[0] = reqs[1] = NULL;
    }
out:
    release_slot(call);
    /* a failed post leaves at most reqs[0] pending, and only on a broken
     * endpoint, where the core fails it: free detaches it meanwhile */
    if (reqs[0] && !req_done(reqs[0])) stage = NULL;
    slime_req_free(reqs[0]);
    slime_req_free(reqs[1]);
    free(stage);
    slime_rpc_mem_free(bulk_owned);
    pthread_mutex_lock(&srv->mu);
    bool last = call_end_locked(srv, call);
    pthread_mutex_unlock(&srv->mu);
    call_free(call);
    if (last) srv_free(srv);
    return st;
}

static slime_status_t finish_checked(slime_rpc_call_t *call, uint8_t kind, const rpc_parts_t *m,
                                     int64_t timeout_ms, const char *what) {
    if (!call) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL call", what);
    if ((!m->buf && m->len) || (!m->tail && m->tail_len) || m->len > SIZE_MAX - m->tail_len)
        return slime_errorf(SLIME_ERR_INVAL, "%s: a NULL buffer with a length, or too long", what);
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "%s: negative timeout", what);
    return call_finish(call, kind, m, timeout_ms);
}

slime_status_t slime_rpc_call_reply(slime_rpc_call_t *call, const void *buf, size_t len, int64_t timeout_ms) {
    rpc_parts_t m = {.buf = buf, .len = len};
    return finish_checked(call, RPC_REPLY, &m, timeout_ms, "rpc_call_reply");
}

slime_status_t slime_rpc_call_reply_parts(slime_rpc_call_t *call, const void *buf, size_t len, const void *tail,
                                          size_t tail_len, int64_t timeout_ms) {
    rpc_parts_t m = {.buf = buf, .len = len, .tail = tail, .tail_len = tail_len};
    return finish_checked(call, RPC_REPLY, &m, timeout_ms, "rpc_call_reply_parts");
}

slime_status_t slime_rpc_call_fail(slime_rpc_call_t *call, const void *buf, size_t len, int64_t timeout_ms) {
    rpc_parts_t m = {.buf = buf, .len = len};
    return finish_checked(call, RPC_ERROR, &m, timeout_ms, "rpc_call_fail");
}

slime_status_t slime_rpc_call_reply_commit(slime_rpc_call_t *call, size_t len, int64_t timeout_ms) {
    if (!call) return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_commit: NULL call");
    if (!call->reply_stage && !call->reply_bulk)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_commit: no reply buffer (call rpc_call_reply_buffer)");
    if (len > call->reply_cap)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_commit: %zu bytes in a %zu-byte buffer", len,
                            call->reply_cap);
    rpc_parts_t m = {.buf = call->reply_stage ? call->reply_stage + RPC_HDR : call->reply_bulk, .len = len};
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "rpc_call_reply_commit: negative timeout");
    return call_finish(call, RPC_REPLY, &m, timeout_ms);
}

void slime_rpc_call_drop(slime_rpc_call_t *call) {
    if (!call) return;
    slime_rpc_server_t *srv = call->srv;
    pthread_mutex_lock(&srv->mu);
    if (call->slot) { /* freed, not reposted: the context may be gone */
        rpc_slot_free(call->slot);
        srv->n_slots--;
    }
    bool last = call_end_locked(srv, call);
    pthread_mutex_unlock(&srv->mu);
    call_free(call);
    if (last) srv_free(srv);
}
