/* SlimeRPC's private objects, shared by csrc/rpc/.
 *
 * Everything travels with the public send/recv API, in the RPC tag space
 * (top 16 bits all ones, see SLIME_RPC_TAG_SPACE):
 *
 *   bits 47..46  00 request mailbox   bits 15..0  server port
 *                01 reply mailbox     bits 15..0  client id
 *                10 request bulk      bits 45..30 client id, 29..0 request id
 *                11 reply bulk        (same)
 *
 * A mailbox is a FIFO of receives of slot_size bytes, posted in order: the
 * core matches a tag's receives in post order, so the slots that have
 * completed are always a prefix of the FIFO and only its head needs a
 * look.  Request mailboxes are receives from any endpoint (one server,
 * many clients); reply mailboxes are receives on the client's endpoint.
 *
 * Waiting: a thread waits in the core (ctx_wait_until: it spins driving
 * progress, then sleeps until a request completes) on a predicate that
 * only looks (see *_ready): a predicate runs under the core's sleep
 * mutex, so it must neither post nor block on our own locks (posting
 * takes ctx->lock, which may take the sleep mutex: a cycle).  It takes
 * our lock with trylock and answers "look again" when that fails. */
#ifndef SLIME_RPC_INTERNAL_H
#define SLIME_RPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

#define RPC_MAGIC 0x43505253u /* "SRPC" */

enum rpc_kind {
    RPC_HELLO = 1,     /* client -> server: version, digest, credits wanted */
    RPC_HELLO_ACK = 2, /* server -> client: credits granted, slot size */
    RPC_REQUEST = 3,
    RPC_REPLY = 4,
    RPC_ERROR = 5,     /* a reply whose payload describes a failure */
};

/* The payload's bytes past the first `head` (which travel inline, after
 * the header) follow as one bulk transfer: a large tensor moves from the
 * sender's memory while the pickle around it rides in the mailbox. */
#define RPC_F_BULK 0x1u
/* REQUEST: the payload lies in a block of shared memory the client lends
 * (rpc_lend_t inline, the payload from the block's start), which the
 * server maps and reads in place.  REPLY, ERROR: the payload's last
 * len - head bytes lie in the request's block from off, handed back with
 * no copy; its first head bytes ride inline and go in front of them
 * (head <= off).  HELLO: a probe block rides inline; HELLO_ACK: the
 * server could fetch it (see lend.h). */
#define RPC_F_LENT 0x2u
/* REPLY, ERROR to a lent request: the server still holds a view of the
 * block (its handler kept one), so the client never uses it again. */
#define RPC_F_KEPT 0x4u

/* Sits at the start of every mailbox message, the payload (if inline)
 * right after it. */
typedef struct rpc_hdr {
    uint32_t magic;
    uint16_t version;
    uint8_t kind, flags;
    uint32_t cid;      /* the client's id: its reply tag */
    union {
        uint32_t credits;  /* HELLO: wanted; HELLO_ACK: granted */
        uint32_t head;     /* REQUEST, REPLY with RPC_F_BULK or _LENT: payload bytes inline */
    };
    union {
        uint64_t method;   /* REQUEST: method id; HELLO, HELLO_ACK: service digest */
        uint64_t off;      /* REPLY, ERROR with RPC_F_LENT: the payload's start in the block */
    };
    uint64_t req_id;   /* HELLO and its answer: a nonce */
    uint64_t len;      /* payload bytes; HELLO_ACK with RPC_F_LENT: the largest block lent */
    uint64_t slot;     /* sender's slot size: the receiver's inline limit */
} rpc_hdr_t;

#define RPC_HDR sizeof(rpc_hdr_t)

#define RPC_TAG_REQ 0ull
#define RPC_TAG_REPLY 1ull
#define RPC_TAG_BULK_REQ 2ull
#define RPC_TAG_BULK_REPLY 3ull
#define RPC_CID_BITS 16
#define RPC_REQ_BITS 30

static inline uint64_t rpc_tag(uint64_t kind, uint64_t low) {
    return SLIME_RPC_TAG_SPACE | kind << 46 | low;
}
static inline uint64_t rpc_bulk_tag(uint64_t kind, uint32_t cid, uint64_t req_id) {
    return rpc_tag(kind, (uint64_t)cid << RPC_REQ_BITS | (req_id & ((1ull << RPC_REQ_BITS) - 1)));
}

/* One posted receive of a mailbox. */
typedef struct rpc_slot {
    slime_list_t link;   /* the mailbox FIFO, while posted */
    slime_req_t *req;
    uint8_t *buf;
} rpc_slot_t;

/* Posts slot's receive (recv_any if ep is NULL).  Under the owner's lock. */
slime_status_t rpc_slot_post(slime_ctx_t *ctx, slime_ep_t *ep, rpc_slot_t *slot, size_t size,
                             uint64_t tag);
/* Frees a slot: a pending receive is canceled first. */
void rpc_slot_free(rpc_slot_t *slot);

/* payload_pool.c: memory for payloads; large buffers are reused, not
 * faulted in afresh for every call.  Free with slime_rpc_mem_free. */
void *rpc_mem_alloc(size_t len);
/* Once per process, at the first channel: one faulted idle block (see
 * payload_pool.c), so a first large call does not fault in its payload. */
void rpc_mem_prime(void);
/* slime_rpc_mem_free(p) calls drop(arg) from now on; false without memory. */
bool rpc_mem_adopt(void *p, void (*drop)(void *arg), void *arg);
/* The header of a completed slot, or NULL (with a detail in why) if the
 * message is no RPC header.  The version is the caller's to check (a
 * hello of another version deserves an answer that says so). */
const rpc_hdr_t *rpc_slot_header(rpc_slot_t *slot, char *why, size_t whylen);
void rpc_hdr_fill(rpc_hdr_t *h, uint8_t kind, uint32_t cid);

/* A payload in two parts, sent as their concatenation: how much of it
 * rides inline (split), and the staging of the inline bytes. */
typedef struct rpc_parts {
    const void *buf, *tail;
    size_t len, tail_len;
} rpc_parts_t;
static inline size_t rpc_parts_total(const rpc_parts_t *p) { return p->len + p->tail_len; }
/* The bytes of p that go inline with a header into a slot of `room`
 * bytes: all of them, or a head that leaves one contiguous bulk part
 * (the tail, or when buf itself does not fit, everything: head 0). */
size_t rpc_parts_head(const rpc_parts_t *p, size_t room);
/* Copies p's bytes [0, n) to dst. */
void rpc_parts_copy(const rpc_parts_t *p, uint8_t *dst, size_t n);
/* The one contiguous buffer of p's bytes [head, total) when head is from
 * rpc_parts_head, or NULL when they straddle the parts (then *joined is a
 * copy, rpc_mem_alloc'd; NULL with *joined NULL: out of memory). */
const void *rpc_parts_bulk(const rpc_parts_t *p, size_t head, void **joined);

/* A transfer nobody waits for, whose buffer (slime_rpc_mem_free'd)
 * we own: both are freed from the request's completion callback, when
 * the core is done with them, whether their owner still lives or not. */
void rpc_orphan_add(slime_req_t *req, void *buf);

/* Client ids: unique among the live clients of this process. */
slime_status_t rpc_cid_alloc(uint32_t *cid);
void rpc_cid_free(uint32_t cid);

/* ---- lending (lend.h) ---- */
struct lend_block;
struct lend_map;

/* ---- server ---- */
/* A client endpoint at the server, from its first message until it is
 * gone and none of its calls is left: the server keeps a reference on
 * the endpoint meanwhile (a call's reply may still be sent to it), then
 * lets the core free it.  The bytes of its bulk payloads announced that
 * have not arrived stay within the server's budget. */
typedef struct rpc_peer {
    slime_list_t link;            /* srv->peers */
    slime_ep_t *ep;
    uint32_t calls;               /* its calls not finished, staged ones included */
    uint64_t unreceived;          /* bytes of its bulk receives posted, not complete */
    uint32_t staged;              /* its calls in srv->staged */
    slime_list_t maps;            /* lend_map_t: blocks its clients lent us */
    uint32_t n_maps;
} rpc_peer_t;

struct slime_rpc_server {
    slime_ctx_t *ctx;
    uint16_t port;
    uint64_t digest;
    uint64_t *methods;            /* sorted */
    size_t n_methods;
    slime_rpc_opts_t opts;
    pthread_mutex_t mu;
    slime_list_t posted;          /* rpc_slot_t: the mailbox FIFO */
    size_t n_slots;               /* posted + held by calls */
    uint64_t granted;             /* credits granted so far */
    slime_list_t staged;          /* calls whose bulk payload is arriving, or
                                     waits for its peer's budget */
    slime_list_t peers;           /* rpc_peer_t, the latest to send first */
    uint64_t bulk_budget;         /* DLSLIME_RPC_BULK_BUDGET */
    _Atomic bool closing;
    _Atomic int waiters;          /* threads inside slime_rpc_server_next */
    /* under mu: one thread in slime_rpc_server_next waits in the core
     * (leading); the others (following) sleep on follow_cond */
    bool leading;
    uint32_t following;
    pthread_cond_t follow_cond;
    int refs;                     /* 1 for the server + 1 per unfinished call */
    slime_list_t link;            /* the process's server list (port check) */
};

struct slime_rpc_call {
    slime_rpc_server_t *srv;
    slime_list_t link;            /* srv->staged */
    slime_ep_t *ep;
    uint32_t cid;
    uint64_t method, req_id;
    size_t reply_inline;          /* the client's slot size */
    rpc_slot_t *slot;             /* the request's slot, NULL once released */
    uint8_t *data;
    size_t len;
    uint32_t head;                /* bytes of a bulk payload that came inline */
    uint8_t *prefix;              /* those bytes while the bulk waits (malloc'd) */
    void *owned;                  /* memory holding data if not the slot's */
    rpc_peer_t *peer;             /* its endpoint's entry */
    slime_req_t *bulk_req;        /* the bulk payload arriving; NULL while
                                     it waits for the peer's budget */
    uint8_t *reply_stage;         /* reply_buffer: header + inline room */
    void *reply_bulk;             /* reply_buffer: a payload sent by bulk */
    size_t reply_cap;
    struct lend_map *lent;        /* the mapping data lies in, if lent */
    bool kept;                    /* data was lent and detached: the handler kept a view */
};

/* ---- client ---- */
struct slime_rpc_client {
    slime_ctx_t *ctx;
    slime_ep_t *ep;
    uint16_t port;
    uint32_t cid;
    uint64_t digest;
    size_t slot_size;             /* our reply slots */
    size_t req_inline;            /* the server's slot size */
    uint32_t credits;
    pthread_mutex_t mu;
    rpc_slot_t **slots;           /* n_slots, posted or dead */
    uint32_t n_slots;
    slime_list_t posted;          /* the reply mailbox FIFO */
    slime_rpc_req_t **table;      /* by credit index: requests on the wire */
    uint32_t *free_idx, n_free;
    uint32_t gen;
    slime_list_t queued;          /* requests waiting for a credit */
    slime_list_t settling;        /* replied, their transfers finishing */
    slime_status_t broken;        /* SLIME_OK until the channel fails */
    char broken_text[256];
    _Atomic int waiters;          /* threads waiting on its requests */
    bool lend_ok;                 /* the server fetched the hello's probe block */
    uint64_t lend_max;            /* ...and maps blocks of up to this many bytes */
    slime_rpc_lend_stats_t lend_stats;
};

struct slime_rpc_req {
    slime_rpc_client_t *cli;      /* NULL once the client is destroyed */
    slime_list_t link;            /* cli->queued or cli->settling */
    uint64_t method;
    rpc_parts_t msg;
    void *joined;                 /* msg's bulk bytes copied together, if they straddle */
    void *reply_buf;              /* the caller's memory for the reply, if any */
    size_t reply_cap;
    bool in_reply_buf;            /* the reply landed there */
    uint32_t idx;
    uint64_t id;                  /* 0 until it has a credit */
    _Atomic int state;            /* SLIME_INPROGRESS, or the final status */
    bool reply_got;               /* the reply header came */
    bool remote_error;
    bool abandoned;               /* freed by its owner while pending */
    uint8_t *stage;               /* header + inline payload */
    slime_req_t *send_req, *bulk_send_req, *bulk_recv_req;
    uint8_t *result;
    size_t result_len;
    void *result_mem;             /* memory holding result */
    struct lend_block *lend;      /* the block its payload was lent in: until the
                                     reply, or with the result read in place */
    char *error;
};

#endif
