/* The client: the hello, credits, request ids, its reply mailbox, and
 * what happens to replies nobody waits for any more. */
#include <inttypes.h>
#include <stddef.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/lend.h"

/* Guards req->cli and the decision that a request is final when its
 * client goes away: a waiter that finds a request pending under it knows
 * the client lives until the waiter leaves (cli->waiters). */
static pthread_mutex_t clients_mu = PTHREAD_MUTEX_INITIALIZER;

#define REQ_IDX_BITS 10 /* SLIME_RPC_CREDITS_MAX = 1 << REQ_IDX_BITS */

static inline bool rreq_final(const slime_rpc_req_t *r) {
    return atomic_load_explicit(&r->state, memory_order_acquire) != SLIME_INPROGRESS;
}

static uint64_t reply_tag(const slime_rpc_client_t *cli) { return rpc_tag(RPC_TAG_REPLY, cli->cid); }

static void rreq_destroy(slime_rpc_req_t *r) {
    lend_block_unref(r->lend);
    slime_rpc_mem_free(r->result_mem);
    slime_rpc_mem_free(r->joined);
    slime_rpc_mem_free(r->stage);
    free(r->error);
    free(r);
}

/* A transfer nobody waits for: it and its buffer are freed once done. */
static void drop_sub(slime_req_t **req, void *buf) {
    rpc_orphan_add(*req, buf);
    *req = NULL;
}

/* Under cli->mu: r is over with st (text for failures). */
static void rreq_finish_locked(slime_rpc_client_t *cli, slime_rpc_req_t *r, slime_status_t st, const char *text) {
    list_del(&r->link);
    if (r->id && cli->table[r->idx] == r) {
        /* a failure before the reply: the channel is broken, and its
         * credit is gone with it */
        cli->table[r->idx] = NULL;
    }
    drop_sub(&r->send_req, r->stage);
    r->stage = NULL;
    drop_sub(&r->bulk_send_req, r->joined);
    r->joined = NULL;
    if (r->bulk_recv_req) {
        drop_sub(&r->bulk_recv_req, r->result_mem);
        r->result_mem = NULL;
        r->result = NULL;
        r->result_len = 0;
        r->in_reply_buf = false;
    }
    if (st != SLIME_OK && !r->error) r->error = strdup(text ? text : slime_strerror(st));
    bool abandoned = r->abandoned;
    atomic_store_explicit(&r->state, st, memory_order_release);
    if (abandoned) rreq_destroy(r);
}

/* Under cli->mu: the channel is broken; every request fails with st. */
static void break_locked(slime_rpc_client_t *cli, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void break_locked(slime_rpc_client_t *cli, slime_status_t st, const char *fmt, ...) {
    if (cli->broken == SLIME_OK) {
        cli->broken = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cli->broken_text, sizeof cli->broken_text, fmt, ap);
        va_end(ap);
    }
    for (uint32_t i = 0; i < cli->credits; i++)
        if (cli->table[i]) rreq_finish_locked(cli, cli->table[i], cli->broken, cli->broken_text);
    slime_list_t *lists[] = {&cli->queued, &cli->settling};
    for (size_t k = 0; k < 2; k++) {
        slime_list_t *pos, *tmp;
        list_for_each_safe(pos, tmp, lists[k]) {
            slime_rpc_req_t *r = container_of(pos, slime_rpc_req_t, link);
            rreq_finish_locked(cli, r, cli->broken, cli->broken_text);
        }
    }
}

/* Under cli->mu: puts r on the wire with a free credit. */
static void issue_locked(slime_rpc_client_t *cli, slime_rpc_req_t *r) {
    r->idx = cli->free_idx[--cli->n_free];
    cli->table[r->idx] = r;
    r->id = (uint64_t)++cli->gen << REQ_IDX_BITS | r->idx;
    size_t total = rpc_parts_total(&r->msg);
    size_t head = r->lend ? 0 : rpc_parts_head(&r->msg, cli->req_inline - RPC_HDR);
    const void *bulk = head < total && !r->lend ? rpc_parts_bulk(&r->msg, head, &r->joined) : NULL;
    size_t inline_len = r->lend ? sizeof(rpc_lend_t) : head;
    r->stage = rpc_mem_alloc(RPC_HDR + inline_len);
    if (!r->stage || (head < total && !bulk && !r->lend)) {
        cli->table[r->idx] = NULL;
        cli->free_idx[cli->n_free++] = r->idx;
        r->id = 0;
        rreq_finish_locked(cli, r, SLIME_ERR_NOMEM, "rpc call: out of memory");
        return;
    }
    rpc_hdr_t *h = (rpc_hdr_t *)r->stage;
    rpc_hdr_fill(h, RPC_REQUEST, cli->cid);
    h->method = r->method;
    h->req_id = r->id;
    h->len = total;
    h->slot = cli->slot_size;
    if (r->lend) {
        h->flags |= RPC_F_LENT;
        lend_describe(r->lend, (rpc_lend_t *)(r->stage + RPC_HDR));
    } else if (head < total) {
        h->flags |= RPC_F_BULK;
        h->head = (uint32_t)head;
    }
    if (!r->lend) rpc_parts_copy(&r->msg, r->stage + RPC_HDR, head);
    slime_status_t st =
        slime_send(cli->ep, r->stage, RPC_HDR + inline_len, rpc_tag(RPC_TAG_REQ, cli->port), &r->send_req);
    if (st == SLIME_OK && bulk)
        st = slime_send(cli->ep, bulk, total - head, rpc_bulk_tag(RPC_TAG_BULK_REQ, cli->cid, r->id),
                        &r->bulk_send_req);
    if (st != SLIME_OK) {
        char why[200];
        snprintf(why, sizeof why, "%s", slime_last_error());
        break_locked(cli, st, "the server is unreachable: %s", why);
    }
}

static void issue_queued_locked(slime_rpc_client_t *cli) {
    while (cli->n_free && !list_empty(&cli->queued) && cli->broken == SLIME_OK) {
        slime_rpc_req_t *r = list_first(&cli->queued, slime_rpc_req_t, link);
        list_del(&r->link);
        issue_locked(cli, r);
    }
}

static bool sub_pending(const slime_req_t *q) { return q && !req_done(q); }

/* Under cli->mu: r has its reply header; final once its transfers are. */
static void settle_locked(slime_rpc_client_t *cli, slime_rpc_req_t *r) {
    if (sub_pending(r->send_req) || sub_pending(r->bulk_send_req) || sub_pending(r->bulk_recv_req)) {
        if (!list_linked(&r->link)) list_push_back(&cli->settling, &r->link);
        return;
    }
    slime_status_t st = SLIME_OK;
    char text[300] = "";
    if (r->bulk_recv_req) {
        st = atomic_load(&r->bulk_recv_req->state);
        if (st != SLIME_OK) snprintf(text, sizeof text, "receiving the reply failed: %s", slime_req_error(r->bulk_recv_req));
        slime_req_free(r->bulk_recv_req);
        r->bulk_recv_req = NULL;
        if (st != SLIME_OK) {
            slime_rpc_mem_free(r->result_mem);
            r->result_mem = NULL;
            r->result = NULL;
            r->result_len = 0;
            r->in_reply_buf = false;
        }
    }
    rreq_finish_locked(cli, r, st, text);
}

static void repost_locked(slime_rpc_client_t *cli, rpc_slot_t *slot) {
    slime_req_free(slot->req);
    slot->req = NULL;
    if (rpc_slot_post(cli->ctx, cli->ep, slot, cli->slot_size, reply_tag(cli)) == SLIME_OK)
        list_push_back(&cli->posted, &slot->link);
    /* else the endpoint is down: its other slots fail and break the channel */
}

/* Where r's reply of h->len bytes lands: the caller's buffer if it fits
 * (and is no error text), else memory of the request's own. */
static uint8_t *reply_memory(slime_rpc_req_t *r, const rpc_hdr_t *h) {
    if (r->reply_buf && h->kind == RPC_REPLY && h->len <= r->reply_cap) {
        r->in_reply_buf = true;
        return r->reply_buf;
    }
    r->result_mem = rpc_mem_alloc(h->len);
    return r->result_mem;
}

/* Under cli->mu: a reply whose payload's tail lies in r's own lent
 * block, at h->off, its head (inline) to go in front of it: r's result
 * is read there (and r keeps the block until freed), or copied into the
 * caller's buffer. */
static void on_reply_in_block_locked(slime_rpc_client_t *cli, slime_rpc_req_t *r, const rpc_hdr_t *h,
                                     const uint8_t *inl) {
    lend_block_t *b = r->lend;
    size_t head = h->head, tail = h->len - head; /* the mailbox checked head <= len */
    if (!b || (h->flags & RPC_F_KEPT) || head > h->off || h->off > b->cap || tail > b->cap - h->off) {
        rreq_finish_locked(cli, r, SLIME_ERR_PROTOCOL, "rpc: a reply in a block the request did not lend");
        return;
    }
    cli->lend_stats.in_place++;
    uint8_t *start = b->map + (h->off - head);
    if (!r->abandoned) memcpy(start, inl, head);
    if (!r->abandoned && r->reply_buf && h->kind == RPC_REPLY && h->len <= r->reply_cap) {
        memcpy(r->reply_buf, start, h->len);
        r->in_reply_buf = true;
        r->result = r->reply_buf;
        lend_block_unref(b);
        r->lend = NULL;
    } else {
        r->result = start;
    }
    r->result_len = h->len;
    settle_locked(cli, r);
}

/* Under cli->mu: a reply header for the request it names. */
static void on_reply_locked(slime_rpc_client_t *cli, const rpc_hdr_t *h, const uint8_t *payload) {
    uint32_t idx = (uint32_t)(h->req_id & ((1u << REQ_IDX_BITS) - 1));
    slime_rpc_req_t *r = idx < cli->credits ? cli->table[idx] : NULL;
    if (!r || r->id != h->req_id) return; /* not one of ours (an old channel's) */
    cli->table[idx] = NULL;
    cli->free_idx[cli->n_free++] = idx; /* the server gave its slot back before replying */
    r->reply_got = true;
    r->remote_error = h->kind == RPC_ERROR;
    if (h->flags & RPC_F_LENT) {
        on_reply_in_block_locked(cli, r, h, payload);
        return;
    }
    if (r->lend) { /* the server is done with the block: it serves the next call, unless kept */
        if (h->flags & RPC_F_KEPT) {
            lend_forget(r->lend);
            cli->lend_stats.kept++;
        }
        lend_block_unref(r->lend);
        r->lend = NULL;
    }
    bool bulk = h->flags & RPC_F_BULK;
    size_t head = bulk ? h->head : h->len;
    uint8_t *mem = r->abandoned ? NULL : reply_memory(r, h);
    if (mem && head) memcpy(mem, payload, head);
    r->result = mem;
    r->result_len = mem ? h->len : 0;
    if (bulk) {
        /* without memory (abandoned, or none left) a zero-byte receive
         * takes the message and drops it */
        uint64_t tag = rpc_bulk_tag(RPC_TAG_BULK_REPLY, cli->cid, h->req_id);
        slime_status_t st = slime_recv(cli->ep, mem ? mem + head : NULL, mem ? h->len - head : 0, tag,
                                       &r->bulk_recv_req);
        if (st != SLIME_OK) {
            rreq_finish_locked(cli, r, st, "rpc: cannot receive the reply");
            return;
        }
    }
    if (!mem && !r->abandoned) {
        rreq_finish_locked(cli, r, SLIME_ERR_NOMEM, "rpc: out of memory for the reply");
        return;
    }
    settle_locked(cli, r);
}

/* Under cli->mu: takes every completed slot off the mailbox's head, and
 * finishes what can be. */
static void drain_locked(slime_rpc_client_t *cli) {
    for (;;) {
        rpc_slot_t *head = list_first(&cli->posted, rpc_slot_t, link);
        if (!head || !req_done(head->req)) break;
        list_del(&head->link);
        slime_status_t st = atomic_load(&head->req->state);
        if (st != SLIME_OK) {
            char why[200];
            snprintf(why, sizeof why, "%s", slime_req_error(head->req));
            if (st == SLIME_ERR_CANCELED) st = SLIME_ERR_CLOSED;
            break_locked(cli, st, "the server is gone (port %u): %s", cli->port, why);
            continue; /* the slot stays off the mailbox; destroy frees it */
        }
        char why[160];
        const rpc_hdr_t *h = rpc_slot_header(head, why, sizeof why);
        if (h && h->version == SLIME_RPC_VERSION && (h->kind == RPC_REPLY || h->kind == RPC_ERROR))
            on_reply_locked(cli, h, head->buf + RPC_HDR);
        repost_locked(cli, head);
    }
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &cli->settling) {
        slime_rpc_req_t *r = container_of(pos, slime_rpc_req_t, link);
        settle_locked(cli, r);
    }
    issue_queued_locked(cli);
}

/* ---- the hello ---- */

/* The hello and its answer.  With a probe block, the hello offers it
 * (lend.h): the server's answer says whether it could fetch it. */
static slime_status_t hello_with(slime_rpc_client_t *cli, int64_t timeout_ms, const lend_block_t *probe) {
    uint64_t deadline = deadline_after_ms(timeout_ms);
    uint64_t nonce = random_u64() | 1;
    size_t extra = probe ? sizeof(rpc_lend_t) : 0;
    rpc_hdr_t *h = rpc_mem_alloc(RPC_HDR + extra);
    if (!h) return slime_errorf(SLIME_ERR_NOMEM, "rpc_client_create: out of memory");
    rpc_hdr_fill(h, RPC_HELLO, cli->cid);
    h->credits = cli->credits;
    h->method = cli->digest;
    h->req_id = nonce;
    h->slot = cli->slot_size;
    if (probe) {
        h->flags |= RPC_F_LENT;
        lend_describe(probe, (rpc_lend_t *)(h + 1));
    }
    slime_req_t *send = NULL;
    slime_status_t st = slime_send(cli->ep, h, RPC_HDR + extra, rpc_tag(RPC_TAG_REQ, cli->port), &send);
    if (st != SLIME_OK) {
        slime_rpc_mem_free(h);
        return st;
    }
    rpc_orphan_add(send, h); /* freed once sent */
    for (;;) {
        rpc_slot_t *head = list_first(&cli->posted, rpc_slot_t, link);
        if (!head) return slime_errorf(SLIME_ERR_PEER_LOST, "rpc_client_create: the endpoint is down");
        uint64_t now = now_ns();
        int64_t left = now < deadline ? (int64_t)((deadline - now) / 1000000u) : 0;
        st = slime_req_wait(head->req, left);
        if (st == SLIME_ERR_TIMEOUT)
            return slime_errorf(st, "no answer to the hello from port %u within %lld ms: is a server for this "
                                    "service running there?", cli->port, (long long)timeout_ms);
        if (st != SLIME_OK) return st;
        list_del(&head->link);
        char why[160];
        const rpc_hdr_t *a = rpc_slot_header(head, why, sizeof why);
        if (!a || a->req_id != nonce || (a->kind != RPC_HELLO_ACK && a->kind != RPC_ERROR)) {
            repost_locked(cli, head); /* a stray answer to an older channel */
            continue;
        }
        if (a->kind == RPC_ERROR) {
            /* "RpcError\0<text>\0": the text is what matters */
            const char *type = (const char *)head->buf + RPC_HDR;
            size_t n = a->len, tl = strnlen(type, n);
            char text[400];
            snprintf(text, sizeof text, "%.*s", tl < n ? (int)(n - tl - 1) : 0, tl < n ? type + tl + 1 : "");
            repost_locked(cli, head);
            return slime_errorf(SLIME_ERR_REFUSED, "rpc: the server refused the channel: %s", text);
        }
        if (a->version != SLIME_RPC_VERSION || a->method != cli->digest) {
            repost_locked(cli, head);
            return slime_errorf(SLIME_ERR_REFUSED, "rpc: the server answered with version %u / digest %016" PRIx64
                                                   ", expected %u / %016" PRIx64,
                                a->version, a->method, SLIME_RPC_VERSION, cli->digest);
        }
        if (a->slot < SLIME_RPC_SLOT_MIN || a->credits < 1 || a->credits > cli->credits) {
            repost_locked(cli, head);
            return slime_errorf(SLIME_ERR_PROTOCOL, "rpc: the server granted %u credits with %llu-byte slots",
                                a->credits, (unsigned long long)a->slot);
        }
        cli->credits = a->credits;
        cli->req_inline = a->slot;
        cli->lend_ok = probe && (a->flags & RPC_F_LENT);
        cli->lend_max = cli->lend_ok ? a->len : 0;
        repost_locked(cli, head);
        return SLIME_OK;
    }
}

static slime_status_t hello(slime_rpc_client_t *cli, int64_t timeout_ms) {
    lend_block_t *probe = lend_wanted(cli->ep) ? lend_probe_new() : NULL;
    slime_status_t st = hello_with(cli, timeout_ms, probe);
    if (st == SLIME_OK && probe && probe->cap >= LEND_MIN && lend_keep(probe)) { /* the primed one */
        cli->lend_stats.blocks++;
        probe = NULL;
    }
    lend_block_unref(probe);
    return st;
}

static void client_free(slime_rpc_client_t *cli) {
    for (uint32_t i = 0; i < cli->n_slots; i++) rpc_slot_free(cli->slots[i]);
    if (cli->cid) rpc_cid_free(cli->cid);
    pthread_mutex_destroy(&cli->mu);
    free(cli->slots);
    free(cli->table);
    free(cli->free_idx);
    free(cli);
}

slime_status_t slime_rpc_client_create(slime_ctx_t *ctx, slime_ep_t *ep, uint16_t port, uint64_t digest,
                                       const slime_rpc_opts_t *opts, int64_t timeout_ms,
                                       slime_rpc_client_t **out) {
    if (out) *out = NULL;
    if (!ctx || !ep || !out)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_client_create: NULL %s", !ctx ? "context" : !ep ? "endpoint" : "out");
    if (ep->ctx != ctx) return slime_errorf(SLIME_ERR_INVAL, "rpc_client_create: the endpoint belongs to another context");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "rpc_client_create: negative timeout");
    slime_rpc_opts_t o;
    slime_rpc_opts_init(&o);
    if (opts) o = *opts;
    if (o.slot_size < SLIME_RPC_SLOT_MIN || o.credits < 1 || o.credits > SLIME_RPC_CREDITS_MAX)
        return slime_errorf(SLIME_ERR_INVAL, "rpc_client_create: slot_size %zu (>= %d) or credits %u (1..%d)",
                            o.slot_size, SLIME_RPC_SLOT_MIN, o.credits, SLIME_RPC_CREDITS_MAX);
    slime_rpc_client_t *cli = calloc(1, sizeof *cli);
    if (!cli) return slime_errorf(SLIME_ERR_NOMEM, "rpc_client_create: out of memory");
    cli->ctx = ctx;
    cli->ep = ep;
    cli->port = port;
    cli->digest = digest;
    cli->slot_size = o.slot_size;
    cli->credits = o.credits;
    pthread_mutex_init(&cli->mu, NULL);
    list_init(&cli->posted);
    list_init(&cli->queued);
    list_init(&cli->settling);
    atomic_init(&cli->waiters, 0);
    slime_status_t st = rpc_cid_alloc(&cli->cid);
    cli->slots = calloc(o.credits, sizeof *cli->slots);
    cli->table = calloc(o.credits, sizeof *cli->table);
    cli->free_idx = calloc(o.credits, sizeof *cli->free_idx);
    if (st == SLIME_OK && (!cli->slots || !cli->table || !cli->free_idx))
        st = slime_errorf(SLIME_ERR_NOMEM, "rpc_client_create: out of memory");
    /* one reply slot per credit: every reply has a receive posted */
    for (uint32_t i = 0; st == SLIME_OK && i < o.credits; i++) {
        rpc_slot_t *slot = calloc(1, sizeof *slot);
        if (slot) slot->buf = malloc(o.slot_size);
        if (!slot || !slot->buf) {
            free(slot);
            st = slime_errorf(SLIME_ERR_NOMEM, "rpc_client_create: out of memory for slots");
            break;
        }
        cli->slots[cli->n_slots++] = slot;
        st = rpc_slot_post(ctx, ep, slot, o.slot_size, reply_tag(cli));
        if (st == SLIME_OK) list_push_back(&cli->posted, &slot->link);
    }
    if (st == SLIME_OK) rpc_mem_prime();
    if (st == SLIME_OK) st = hello(cli, timeout_ms);
    if (st != SLIME_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", slime_last_error());
        client_free(cli);
        return slime_errorf(st, "%s", why);
    }
    for (uint32_t i = 0; i < cli->credits; i++) cli->free_idx[cli->n_free++] = cli->credits - 1 - i;
    *out = cli;
    return SLIME_OK;
}

uint32_t slime_rpc_client_credits(const slime_rpc_client_t *cli) { return cli ? cli->credits : 0; }

bool slime_rpc_client_lend_stats(slime_rpc_client_t *cli, slime_rpc_lend_stats_t *out) {
    if (!cli) return false;
    pthread_mutex_lock(&cli->mu);
    if (out) *out = cli->lend_stats;
    bool on = cli->lend_ok;
    pthread_mutex_unlock(&cli->mu);
    return on;
}

void slime_rpc_client_destroy(slime_rpc_client_t *cli) {
    if (!cli) return;
    pthread_mutex_lock(&clients_mu);
    pthread_mutex_lock(&cli->mu);
    break_locked(cli, SLIME_ERR_CLOSED, "the rpc client was closed");
    pthread_mutex_unlock(&cli->mu);
    pthread_mutex_unlock(&clients_mu);
    /* waiters see their requests final and leave */
    while (atomic_load(&cli->waiters) > 0) sched_yield();
    client_free(cli);
}

/* ---- requests ---- */

/* A payload worth lending goes into a block of the client's now, copied
 * outside its lock: a large copy would hold up every other caller. */
static void lend_payload(slime_rpc_client_t *cli, slime_rpc_req_t *r, size_t total) {
    bool made = false;
    r->lend = cli->lend_ok && total >= LEND_MIN && total <= cli->lend_max ? lend_take(total, cli->lend_max, &made)
                                                                          : NULL;
    if (!r->lend) return;
    pthread_mutex_lock(&cli->mu);
    cli->lend_stats.lent++;
    cli->lend_stats.blocks += made;
    pthread_mutex_unlock(&cli->mu);
    rpc_parts_copy(&r->msg, r->lend->map, total);
}

slime_status_t slime_rpc_call_args(slime_rpc_client_t *cli, uint64_t method_id, const slime_rpc_call_args_t *a,
                                   slime_rpc_req_t **out) {
    if (out) *out = NULL;
    if (!cli || !out || !a) return slime_errorf(SLIME_ERR_INVAL, "rpc_call: NULL %s", !cli ? "client" : a ? "out" : "args");
    /* flags came last: a caller built before them passes a shorter struct */
    size_t flags_end = offsetof(slime_rpc_call_args_t, flags) + sizeof a->flags;
    if (a->size < offsetof(slime_rpc_call_args_t, flags))
        return slime_errorf(SLIME_ERR_INVAL, "rpc_call: args.size %zu, expected %zu", a->size, sizeof *a);
    uint32_t flags = a->size >= flags_end ? a->flags : 0;
    if ((!a->buf && a->len) || (!a->tail && a->tail_len) || (!a->reply_buf && a->reply_cap))
        return slime_errorf(SLIME_ERR_INVAL, "rpc_call: a NULL buffer with a length");
    if (a->len > SIZE_MAX - a->tail_len) return slime_errorf(SLIME_ERR_INVAL, "rpc_call: the payload's length overflows");
    slime_rpc_req_t *r = calloc(1, sizeof *r);
    if (!r) return slime_errorf(SLIME_ERR_NOMEM, "rpc_call: out of memory");
    r->cli = cli;
    list_init(&r->link);
    r->method = method_id;
    r->msg = (rpc_parts_t){.buf = a->buf, .len = a->len, .tail = a->tail, .tail_len = a->tail_len};
    r->reply_buf = a->reply_buf;
    r->reply_cap = a->reply_cap;
    atomic_init(&r->state, SLIME_INPROGRESS);
    if (flags & SLIME_RPC_CALL_LEND) lend_payload(cli, r, a->len + a->tail_len);
    pthread_mutex_lock(&cli->mu);
    if (cli->broken != SLIME_OK) {
        slime_status_t st = slime_errorf(cli->broken, "rpc_call: %s", cli->broken_text);
        pthread_mutex_unlock(&cli->mu);
        rreq_destroy(r);
        return st;
    }
    if (cli->n_free && list_empty(&cli->queued)) issue_locked(cli, r);
    else list_push_back(&cli->queued, &r->link);
    pthread_mutex_unlock(&cli->mu);
    *out = r;
    return SLIME_OK;
}

slime_status_t slime_rpc_call(slime_rpc_client_t *cli, uint64_t method_id, const void *buf, size_t len,
                              slime_rpc_req_t **out) {
    slime_rpc_call_args_t a = {.size = sizeof a, .buf = buf, .len = len};
    return slime_rpc_call_args(cli, method_id, &a, out);
}

bool slime_rpc_req_in_reply_buf(const slime_rpc_req_t *r) {
    return r && rreq_final(r) && atomic_load(&r->state) == SLIME_OK && r->in_reply_buf;
}

/* Counts a waiter on r's client; NULL if r is final (or has no client). */
static slime_rpc_client_t *enter(slime_rpc_req_t *r) {
    pthread_mutex_lock(&clients_mu);
    slime_rpc_client_t *cli = rreq_final(r) ? NULL : r->cli;
    if (cli) atomic_fetch_add(&cli->waiters, 1);
    pthread_mutex_unlock(&clients_mu);
    return cli;
}

static void leave(slime_rpc_client_t *cli) { atomic_fetch_sub(&cli->waiters, 1); }

static slime_status_t final_status(const slime_rpc_req_t *r) {
    slime_status_t st = atomic_load_explicit(&r->state, memory_order_acquire);
    if (st != SLIME_OK) slime_errorf(st, "%s", r->error ? r->error : slime_strerror(st));
    return st;
}

/* The wait predicate (see rpc_internal.h: look, never post or block). */
static bool req_ready(void *arg) {
    slime_rpc_req_t *r = arg;
    if (rreq_final(r)) return true;
    slime_rpc_client_t *cli = r->cli; /* alive: we are counted in its waiters */
    if (pthread_mutex_trylock(&cli->mu) != 0) return true;
    const rpc_slot_t *head = list_first(&cli->posted, rpc_slot_t, link);
    bool ready = rreq_final(r) || (head && req_done(head->req));
    slime_list_t *pos;
    for (pos = cli->settling.next; !ready && pos != &cli->settling; pos = pos->next) {
        slime_rpc_req_t *s = container_of(pos, slime_rpc_req_t, link);
        ready = !sub_pending(s->send_req) && !sub_pending(s->bulk_send_req) && !sub_pending(s->bulk_recv_req);
    }
    pthread_mutex_unlock(&cli->mu);
    return ready;
}

slime_status_t slime_rpc_req_test(slime_rpc_req_t *r) {
    if (!r) return slime_errorf(SLIME_ERR_INVAL, "rpc_req_test: NULL request");
    slime_rpc_client_t *cli = enter(r);
    if (cli) {
        if (pthread_mutex_trylock(&cli->mu) == 0) {
            drain_locked(cli);
            rpc_slot_t *head = list_first(&cli->posted, rpc_slot_t, link);
            if (!rreq_final(r) && head) {
                slime_req_test(head->req); /* drives progress once */
                drain_locked(cli);
            }
            pthread_mutex_unlock(&cli->mu);
        }
        leave(cli);
    }
    return rreq_final(r) ? final_status(r) : SLIME_INPROGRESS;
}

slime_status_t slime_rpc_req_wait(slime_rpc_req_t *r, int64_t timeout_ms) {
    if (!r) return slime_errorf(SLIME_ERR_INVAL, "rpc_req_wait: NULL request");
    if (timeout_ms < 0) return slime_errorf(SLIME_ERR_INVAL, "rpc_req_wait: negative timeout");
    slime_rpc_client_t *cli = enter(r);
    if (!cli) return final_status(r);
    uint64_t deadline = deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&cli->mu);
    for (;;) {
        drain_locked(cli);
        if (rreq_final(r) || now_ns() >= deadline) break;
        pthread_mutex_unlock(&cli->mu);
        ctx_wait_until(cli->ctx, req_ready, r, deadline);
        pthread_mutex_lock(&cli->mu);
    }
    pthread_mutex_unlock(&cli->mu);
    leave(cli);
    if (!rreq_final(r))
        return slime_errorf(SLIME_ERR_TIMEOUT, "rpc call still pending after %lld ms", (long long)timeout_ms);
    return final_status(r);
}

bool slime_rpc_req_remote_error(const slime_rpc_req_t *r) {
    return r && rreq_final(r) && atomic_load(&r->state) == SLIME_OK && r->remote_error;
}

const void *slime_rpc_req_data(const slime_rpc_req_t *r, size_t *len) {
    bool ok = r && rreq_final(r) && atomic_load(&r->state) == SLIME_OK;
    if (len) *len = ok ? r->result_len : 0;
    return ok ? r->result : NULL;
}

slime_status_t slime_rpc_req_detach(slime_rpc_req_t *r, void **mem) {
    if (!r || !mem) return slime_errorf(SLIME_ERR_INVAL, "rpc_req_detach: NULL argument");
    *mem = NULL;
    if (!rreq_final(r)) return slime_errorf(SLIME_ERR_INVAL, "rpc_req_detach: the request is still pending");
    if (r->lend && r->result) { /* read in place: the block goes with it */
        if (!rpc_mem_adopt(r->lend->map, lend_block_drop, r->lend))
            return slime_errorf(SLIME_ERR_NOMEM, "rpc_req_detach: out of memory");
        *mem = r->lend->map;
        r->lend = NULL;
        return SLIME_OK;
    }
    *mem = r->result_mem;
    r->result_mem = NULL;
    return SLIME_OK;
}

const char *slime_rpc_req_error(const slime_rpc_req_t *r) {
    if (!r || !rreq_final(r) || atomic_load(&r->state) == SLIME_OK) return "";
    return r->error ? r->error : slime_strerror(atomic_load(&r->state));
}

bool slime_rpc_req_sent(const slime_rpc_req_t *r) {
    if (!r) return true;
    if (rreq_final(r)) return true;
    slime_rpc_client_t *cli = enter((slime_rpc_req_t *)r);
    if (!cli) return true;
    pthread_mutex_lock(&cli->mu);
    /* the payload is copied into the stage or a lent block unless it goes by bulk */
    bool sent = (r->id || r->lend) && !sub_pending(r->bulk_send_req);
    pthread_mutex_unlock(&cli->mu);
    leave(cli);
    return sent;
}

void slime_rpc_req_free(slime_rpc_req_t *r) {
    if (!r) return;
    slime_rpc_client_t *cli = enter(r);
    if (cli) {
        pthread_mutex_lock(&cli->mu);
        if (!rreq_final(r)) {
            if (!r->id) {
                list_del(&r->link); /* still waiting for a credit: never sent */
            } else {
                r->abandoned = true; /* freed when its reply comes, or the channel breaks */
                r = NULL;
            }
        }
        pthread_mutex_unlock(&cli->mu);
        leave(cli);
    }
    if (r) rreq_destroy(r);
}
