/* What servers and clients share: mailbox slots, headers, sends whose
 * buffers we own, client ids, options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/lend.h"

void slime_rpc_opts_init(slime_rpc_opts_t *opts) {
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    /* at most every transport's eager limit (verbs' 64 KiB; shm and tcp
     * go eagerly up to 256 KiB): an inline message is one eager send;
     * bigger payloads go by rendezvous (single copy) anyway */
    opts->slot_size = 64 * 1024;
    opts->credits = 16;
    opts->max_slots = 1024;
}

slime_status_t rpc_slot_post(slime_ctx_t *ctx, slime_ep_t *ep, rpc_slot_t *slot, size_t size,
                             uint64_t tag) {
    slime_req_t *req = NULL;
    slime_status_t st = ep ? slime_recv(ep, slot->buf, size, tag, &req)
                           : slime_recv_any(ctx, slot->buf, size, tag, &req);
    slot->req = req;
    return st;
}

void rpc_slot_free(rpc_slot_t *slot) {
    if (!slot) return;
    slime_req_free(slot->req); /* cancels a receive still posted */
    free(slot->buf);
    free(slot);
}

void rpc_hdr_fill(rpc_hdr_t *h, uint8_t kind, uint32_t cid) {
    memset(h, 0, sizeof *h);
    h->magic = RPC_MAGIC;
    h->version = SLIME_RPC_VERSION;
    h->kind = kind;
    h->cid = cid;
}

const rpc_hdr_t *rpc_slot_header(rpc_slot_t *slot, char *why, size_t whylen) {
    size_t got = slime_req_bytes(slot->req);
    const rpc_hdr_t *h = (const rpc_hdr_t *)slot->buf;
    if (got < RPC_HDR) {
        snprintf(why, whylen, "a %zu-byte message is too short for an RPC header", got);
        return NULL;
    }
    if (h->magic != RPC_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x", h->magic);
        return NULL;
    }
    if (h->flags & RPC_F_LENT) {
        /* a lent request or a hello carries the block's descriptor; a
         * reply in the block, the head that goes in front of its tail */
        bool desc = h->kind == RPC_REQUEST || h->kind == RPC_HELLO;
        bool reply = h->kind == RPC_REPLY || h->kind == RPC_ERROR; /* (HELLO_ACK's credits share head) */
        size_t want = desc ? sizeof(rpc_lend_t) : reply ? h->head : 0;
        if ((h->flags & RPC_F_BULK) || got - RPC_HDR != want || (reply && h->head > h->len)) {
            snprintf(why, whylen, "a lent payload's message has %zu bytes past its header, not %zu", got - RPC_HDR,
                     want);
            return NULL;
        }
        return h;
    }
    if (!(h->flags & RPC_F_BULK) && h->len != got - RPC_HDR) {
        snprintf(why, whylen, "header says %llu payload bytes, the message has %zu",
                 (unsigned long long)h->len, got - RPC_HDR);
        return NULL;
    }
    if ((h->flags & RPC_F_BULK) && (h->head != got - RPC_HDR || h->head > h->len)) {
        snprintf(why, whylen, "a bulk payload of %llu bytes announces %u inline, the message has %zu",
                 (unsigned long long)h->len, h->head, got - RPC_HDR);
        return NULL;
    }
    return h;
}

/* Runs once the core is done with an orphan's request: completed,
 * failed with its endpoint, or at the context's destroy. */
static void orphan_done(slime_req_t *req, void *buf) {
    slime_rpc_mem_free(buf);
    slime_req_free(req);
}

void rpc_orphan_add(slime_req_t *req, void *buf) {
    if (!req) {
        slime_rpc_mem_free(buf);
        return;
    }
    /* ours never carry a callback of their own, so this cannot refuse */
    if (slime_req_on_complete(req, orphan_done, buf) != SLIME_OK) slime_req_free(req);
}

/* ---- client ids ---- */
static pthread_mutex_t cid_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cid_used[(1u << RPC_CID_BITS) / 64];
static uint32_t cid_next = 1;

slime_status_t rpc_cid_alloc(uint32_t *cid) {
    const uint32_t n = 1u << RPC_CID_BITS;
    pthread_mutex_lock(&cid_mu);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = (cid_next + i) % n;
        if (c == 0 || (cid_used[c / 64] >> (c % 64) & 1)) continue;
        cid_used[c / 64] |= 1ull << (c % 64);
        /* round robin: a recent id's stray messages stay unmatched longer */
        cid_next = c + 1;
        pthread_mutex_unlock(&cid_mu);
        *cid = c;
        return SLIME_OK;
    }
    pthread_mutex_unlock(&cid_mu);
    return slime_errorf(SLIME_ERR_BUSY, "rpc: %u clients are alive in this process already", n - 1);
}

void rpc_cid_free(uint32_t cid) {
    pthread_mutex_lock(&cid_mu);
    cid_used[cid / 64] &= ~(1ull << (cid % 64));
    pthread_mutex_unlock(&cid_mu);
}

size_t rpc_parts_head(const rpc_parts_t *p, size_t room) {
    if (room > UINT32_MAX) room = UINT32_MAX; /* the header's head field */
    if (rpc_parts_total(p) <= room) return rpc_parts_total(p);
    return p->len <= room ? p->len : 0;
}

void rpc_parts_copy(const rpc_parts_t *p, uint8_t *dst, size_t n) {
    size_t a = n < p->len ? n : p->len;
    if (a) memcpy(dst, p->buf, a);
    if (n > a) memcpy(dst + a, p->tail, n - a);
}

const void *rpc_parts_bulk(const rpc_parts_t *p, size_t head, void **joined) {
    *joined = NULL;
    if (head >= p->len) return (const uint8_t *)p->tail + (head - p->len);
    if (!p->tail_len) return (const uint8_t *)p->buf + head;
    size_t n = rpc_parts_total(p) - head;
    uint8_t *j = rpc_mem_alloc(n);
    if (!j) return NULL;
    memcpy(j, (const uint8_t *)p->buf + head, p->len - head);
    memcpy(j + (p->len - head), p->tail, p->tail_len);
    *joined = j;
    return j;
}
