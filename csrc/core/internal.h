/* The core's private objects.  One lock per context (ctx->lock) guards
 * every list and state below unless a field says otherwise. */
#ifndef SLIME_INTERNAL_H
#define SLIME_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "core/p2p.h"
#include "core/util.h"
#include "core/wire.h"
#include "dlslime/dlslime.h"

struct transport_ops;
struct mr_shared;

/* ---- requests (req.c) ---- */
enum req_kind {
    REQ_SEND = 1, REQ_RECV, REQ_READ, REQ_WRITE, REQ_IMM_RECV, REQ_BATCH,
    REQ_WORKER,                 /* completed by a worker thread (p2p_req_worker_new) */
};

struct slime_req {
    slime_ctx_t *ctx;
    enum req_kind kind;
    _Atomic int state;          /* SLIME_INPROGRESS or the final status */
    bool detached;              /* freed by the core when it completes */
    char *error;                /* detail of a failure, malloc'd */
    uint64_t id;                /* wire id while the peer may refer to it */
    slime_ep_t *ep;             /* NULL for recv_any until it matches */
    slime_list_t qlink;         /* posted recvs, imm waiters, rma queue */
    slime_list_t eplink;        /* ep->pending: failed with the ep */
    /* what the operation works on */
    uint64_t tag;
    void *buf;                  /* send/recv buffer, or local addr of RMA */
    size_t len;                 /* send length, recv capacity, RMA length */
    size_t done;                /* bytes moved so far (RMA by CMA) */
    size_t bytes;               /* result: bytes received */
    uint32_t imm;
    bool has_imm;
    bool is_write;              /* RMA direction */
    uint64_t r_handle, r_off;   /* RMA target */
    uint32_t r_rkey;
    uint64_t peer_req;          /* rendezvous: the peer's request id */
    /* a combining receive (combine.c): folds the payload into buf,
     * buf[i] = combine(buf[i], in[i]) over elements of esize bytes,
     * instead of copying it; NULL for a plain receive */
    slime_combine_fn combine;
    size_t esize;
    /* recv_opts_t.cold */
    bool cold;
    /* send_opts_t (p2p_send) */
    bool sync;
    bool recv_posted;
    send_path_t path;
    bool coarse;
    slime_mr_t *local_mr;       /* RMA: the local region, pinned */
    /* batches */
    slime_req_t *parent;
    size_t children_left;
    slime_status_t first_err;   /* batch: first child failure */
    slime_req_cb_t cb;          /* slime_req_on_complete */
    void *cb_arg;
    slime_list_t cblink;        /* ctx->callbacks, waiting to be called */
    bool cb_running;            /* its callback is being called now */
    /* REQ_WORKER: runs the work in the waiting thread if it has not
     * started (true: it ran, the request is complete); NULL: never */
    p2p_run_here_fn run_here;
    void *run_here_arg;
};

slime_req_t *req_new(slime_ctx_t *ctx, enum req_kind kind, slime_ep_t *ep);
/* Zeroed memory for a request (req_cache.c): one this thread freed, if
 * it kept one, else calloc's; NULL when out of memory. */
slime_req_t *req_cache_take(void);
/* Frees memory req_cache_take gave, or keeps it for this thread. */
void req_cache_give(slime_req_t *r);
/* Completes req (under ctx->lock); fmt may be NULL on success. */
void req_complete(slime_req_t *req, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint64_t req_id_assign(slime_ctx_t *ctx, slime_req_t *req);
slime_req_t *req_id_lookup(slime_ctx_t *ctx, uint64_t id);
void req_id_release(slime_ctx_t *ctx, slime_req_t *req);
static inline bool req_done(const slime_req_t *r) {
    return atomic_load_explicit(&r->state, memory_order_acquire) != SLIME_INPROGRESS;
}

/* ---- memory regions (mr.c) and their domains (md.c, md.h) ---- */
/* Domains open in one context at most (the table's length). */
#define SLIME_MD_MAX 8
typedef struct md md_t;
typedef struct md_memh md_memh_t;

struct slime_mr {
    slime_ctx_t *ctx;           /* NULL once the context is destroyed */
    slime_list_t link;          /* ctx->mrs */
    uint32_t slot, gen, rkey;
    unsigned access;
    void *addr;
    size_t len;
    _Atomic int local_users;    /* local requests still using it */
    _Atomic int pins;           /* peers' accesses our progress engine is copying */
    bool dying;                 /* under ctx->lock: deregistering, refuses new accesses */
    const md_t *md;             /* the memory domain its bytes belong to */
    int device;                 /* ...and the device in it, or -1 */
    md_memh_t *memh[SLIME_MD_MAX]; /* its registration in ctx->mds[i], or NULL */
};

/* The shared MR table: mapped by every same-host peer so it can check
 * accesses it makes by CMA itself; the stream path checks the same table.
 * Peers of the same build map it: entries keep their size and order. */
#define MR_TABLE_SLOTS 4096
#define MR_TABLE_MAGIC 0x4d525441424c4531ull
enum { MR_FREE = 0, MR_VALID = 1, MR_DYING = 2 };
typedef struct team team_t;

typedef struct mr_entry {
    _Atomic uint32_t state;
    _Atomic uint32_t gen;
    _Atomic int32_t inflight;   /* accesses copying right now */
    uint32_t rkey;
    uint32_t access;
    int32_t block_fd;           /* inside a shared block (shmem.c): its memfd, else -1 */
    uint64_t addr, len;
    uint64_t block_ino, block_base, block_len; /* that block's inode, start and length */
} mr_entry_t;

typedef struct mr_shared {
    uint64_t magic;
    /* 1 while this context's progress thread polls its rings; a peer
     * that writes to a ring rings the doorbell only when this is 0 (a
     * thread spinning in a wait keeps grace_until ahead instead: this
     * line is read by each of the peer's sends, and a count written at
     * every wait's start and end cost both sides a cache miss) */
    _Atomic int32_t polling;
    uint32_t pad;
    /* ...nor until this time (CLOCK_MONOTONIC ns): a thread that just
     * stopped polling is likely to wait again at once, and a doorbell
     * would only wake our progress thread for nothing */
    _Atomic uint64_t grace_until;
    /* blocks of slime_mem_alloc freed in this process: a peer holding
     * mappings of our blocks drops them when this changes (shmem.c) */
    _Atomic uint64_t mem_frees;
    uint32_t pad2[8];
    mr_entry_t slots[MR_TABLE_SLOTS];
} mr_shared_t;

/* Checks an access and pins the entry (inflight++).  On success *addr is
 * where the bytes live in the owner's address space. */
slime_status_t mr_table_acquire(mr_shared_t *t, uint64_t handle, uint32_t rkey,
                                uint64_t off, uint64_t len, unsigned access,
                                uint64_t *addr, char *why, size_t whylen);
void mr_table_release(mr_shared_t *t, uint64_t handle);
/* Takes off table t the pins a peer that ended left on it: pins[s] on
 * slot s (each read once, and no more than the slot holds).  How many. */
uint64_t mr_table_drop_pins(mr_shared_t *t, const _Atomic uint32_t *pins);
/* The owner's check of a peer's access to one of its regions, served by
 * its progress engine (under ctx->lock): against ctx->mr_slots, never the
 * shared table, and pinned privately until mr_own_release. */
slime_status_t mr_own_acquire(slime_ctx_t *ctx, uint64_t handle, uint32_t rkey, uint64_t off, uint64_t len,
                              unsigned access, uint64_t *addr, char *why, size_t whylen);
void mr_own_release(slime_ctx_t *ctx, uint64_t handle);
slime_status_t mr_table_create(int *fd, mr_shared_t **out);

/* memfd.c: a memfd of len bytes sealed against resizing (and further
 * seals), for a peer to map. */
slime_status_t memfd_sealed(const char *name, size_t len, int *fd);
/* Whether a peer's fd is a memfd sealed against resizing, so a mapping
 * of it cannot fault later; its size in *len, else why not in why. */
bool memfd_check(int fd, size_t *len, char *why, size_t whylen);
/* A pidfd for process pid, and a copy of that process's fd through it
 * (the kernel's ptrace access check, as for CMA); -1 with errno. */
int pidfd_of(int pid);
int pidfd_take_fd(int pidfd, int fd);
/* A peer's memfd fd taken through its pidfd and checked against what the
 * peer said of it: sealed against resizing (memfd_check), at least len
 * bytes, of inode ino.  -1 with why filled: errno is the take's when the
 * kernel refused it, else EINVAL. */
int memfd_take_checked(int pidfd, int fd, uint64_t len, uint64_t ino, char *why, size_t whylen);

/* shmem.c: every context's table hears of freed blocks (mem_frees). */
slime_status_t shmem_table_add(mr_shared_t *t);
void shmem_table_remove(mr_shared_t *t);
slime_status_t desc_check(const slime_ep_t *ep, const slime_mr_desc_t *d,
                          uint64_t off, uint64_t len, unsigned access,
                          wire_desc_t *out);

/* ---- the frames every transport carries (frames.c, proto.c, combine.c) ---- */
typedef struct txn {
    slime_list_t link;
    frame_t hdr;
    const void *payload;
    size_t sent;                /* bytes of header + payload sent */
    slime_req_t *req;           /* completed when fully sent, if set */
    uint64_t release_handle;    /* our region to unpin when sent (+1), or 0 (mr_own_release) */
    bool held;                  /* a reply to the peer's request: an item of its budget */
    char text[];                /* small owned payload (error texts) */
} txn_t;

enum rx_state { RX_HDR, RX_PAYLOAD };
enum rx_sink { SINK_DISCARD, SINK_RECV, SINK_UNEXP, SINK_WRITE, SINK_READ, SINK_TEXT };

typedef struct rx_ctx {
    enum rx_state state;
    frame_t hdr;
    size_t hdr_got;
    enum rx_sink sink;
    uint8_t *dst;
    size_t left, got;
    slime_req_t *req;           /* RECV / READ sinks */
    struct umsg *umsg;          /* UNEXP sink */
    uint64_t pinned;            /* WRITE sink: MR handle + 1 */
    slime_status_t status;      /* WRITE/READ/TEXT outcome */
    char text[WIRE_ERRTEXT_MAX];
    bool paused;                /* waiting for unexpected-buffer room, or parked */
    /* paused with an eager payload left in the transport (rx_beyond)
     * until its receive is posted or more arrives behind it */
    bool parked;
    /* a combining receive: the bytes of an element split between two
     * reads, until the element is whole (got % esize of them) */
    _Alignas(16) uint8_t carry[16];
} rx_ctx_t;

/* We hold back from reading the peer (no unexpected-buffer room): its
 * sender may wait on us.  A parked payload's sender waits on nothing. */
static inline bool rx_held_back(const rx_ctx_t *rx) { return rx->paused && !rx->parked; }

/* A message that arrived before its receive was posted. */
typedef struct umsg {
    slime_list_t link;
    slime_ep_t *ep;
    uint64_t tag;
    size_t len;
    void *data;                 /* eager payload; NULL for an RTS */
    bool rts;
    uint64_t sreq;              /* RTS: the sender's request id */
    bool rdma;                  /* RTS with FF_RDMA: the sender's buffer */
    uint64_t raddr;
    uint32_t rkey;
} umsg_t;

/* ---- endpoints (ep.c) ---- */
enum ep_state { EP_CONNECTING, EP_UP, EP_DOWN };

/* What a transport is like, where the core must decide by it
 * (transport_ops_t.caps; ep_has_cap). */
enum {
    /* Bytes arrive in memory the core must poll, with no fd event per
     * arrival (a doorbell wakes only a sleeper): every progress pass
     * reads its endpoints and flushes their queues, and the progress
     * thread spins a while when a peer's one-sided write is half in. */
    TP_CAP_POLLED = 1u << 0,
    /* Its writes stop on a full socket: the core watches for
     * write-readiness while frames wait to go. */
    TP_CAP_WRITE_EVENTS = 1u << 1,
    /* One-sided ops are copied by the initiator's CPU through the
     * peer's memory (CMA), not served by the peer's progress engine. */
    TP_CAP_CPU_RMA = 1u << 2,
};

struct slime_ep {
    slime_ctx_t *ctx;
    slime_list_t link;          /* ctx->eps */
    slime_list_t acceptq;       /* ctx->accepted */
    enum ep_state state;
    slime_status_t down_status;
    char down_reason[160];
    uint64_t peer_id;
    uint64_t peer_job;          /* the job id the peer's descriptors carry */
    uint32_t peer_pid;
    uint32_t verified_pid;      /* the transport's verified_pid, 0: none */
    bool dialing;               /* a thread of ours is dialing this peer */
    bool local;                 /* up, and its peer on this host (ctx->n_local_eps) */
    const struct transport_ops *tp; /* the context's copy of its table */
    void *conn;                 /* the transport's connection state */
    size_t eager;               /* sends up to this size go in one frame */
    int fd;                     /* registered with ctx->epfd, or -1 */
    struct pollable *pollable;
    slime_list_t txq;           /* txn_t, in order */
    bool tx_coarse;             /* the frame writev is given first is a coarse send's (send_opts_t; frames.c sets it) */
    bool want_out;              /* EPOLLOUT armed */
    rx_ctx_t rx;
    slime_list_t pending;       /* reqs that fail when the ep goes down */
    slime_list_t rmaq;          /* RMA reqs done by the transport itself */
    uint32_t *imms;             /* immediates nobody asked for yet */
    size_t imm_head, imm_count, imm_cap;
    slime_list_t imm_waiters;
    char desc[256];             /* slime_ep_describe, set when attached */
    /* peer liveness (liveness.c) */
    uint64_t heard;             /* bumped when bytes come from the peer */
    uint64_t heard_seen;        /* ...its value at the last look */
    uint64_t quiet_since;       /* waiting on the peer, nothing heard since (ns); 0: not waiting */
    uint64_t told_ns;           /* when we last said we are there, unasked */
    bool pinged;                /* a ping is out since quiet_since */
    bool ping_queued;           /* ...and still waits in txq */
    size_t held;                /* items this peer makes us hold (budget.c) */
    uint32_t box_taken;         /* shared box slots reserved or open here (box.c), under ctx->lock */
    /* waits on the peer by a layer above, on a box: the core sees no
     * request, so liveness counts these (p2p_ep_wait_begin) */
    _Atomic unsigned outside_waits;
    /* Its life.  holds: the application's (slime_ep_hold/release; each
     * connect and accept hands one out), under ctx->lock.  refs: pointers
     * to it, one the context's (ctx->eps) and one for each request and
     * unexpected message naming it and each connect waiting on it; taken
     * under ctx->lock, dropped anywhere (a request may outlive its
     * context).  Down, with no holds and only the context's ref, and not
     * dialing nor queued for accept, it is freed by the next progress
     * pass (ep_reap); after the context is gone, by its last ref. */
    unsigned holds;
    _Atomic unsigned refs;
};

slime_ep_t *ep_find(slime_ctx_t *ctx, uint64_t peer_id);
slime_ep_t *ep_new(slime_ctx_t *ctx, uint64_t peer_id);
/* Gives ep its connection and wakes whoever waits for it. */
void ep_attach(slime_ep_t *ep, const struct transport_ops *tp, void *conn,
               int fd, uint32_t peer_pid);
/* Takes ep down with st: fails every pending request, closes the conn. */
void ep_fail(slime_ep_t *ep, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ep_free(slime_ep_t *ep);
static inline void ep_ref(slime_ep_t *ep) { atomic_fetch_add_explicit(&ep->refs, 1, memory_order_relaxed); }
void ep_unref(slime_ep_t *ep);
/* The context is going: drops its ref, so the last request naming ep
 * frees it. */
void ep_orphan(slime_ep_t *ep);
/* Before a close: gives what the transports took (sends that completed)
 * up to the peer silence limit (DLSLIME_PEER_SILENCE_MS; a second where
 * that is off) to reach the peers, as a socket's close does; only ep's,
 * or every endpoint's when only is NULL.  Takes ctx->lock. */
void ep_linger(slime_ctx_t *ctx, slime_ep_t *only);
/* Under ctx->lock, from the progress pass only (no caller up the stack
 * holds ep): frees ep if nothing can reach it any more; whether it did. */
bool ep_reap(slime_ep_t *ep);
/* budget.c: counts an item the peer makes us hold (what: which kind,
 * for the error); false when that puts it over its budget, and then ep
 * is down.  ep_unhold when the item goes. */
void budget_init(slime_ctx_t *ctx);
bool ep_hold(slime_ep_t *ep, const char *what);
void ep_unhold(slime_ep_t *ep);
/* Whether ep's transport has every capability in caps (TP_CAP_*). */
bool ep_has_cap(const slime_ep_t *ep, unsigned caps);

/* frames.c */
void frames_queue(slime_ep_t *ep, txn_t *t);
txn_t *txn_new(uint8_t type, size_t textlen);
int frames_flush(slime_ep_t *ep);   /* >0 if it moved bytes */
/* A frame written at once, with no queue entry, by a caller whose
 * endpoint has nothing queued (ep->txq empty): 1 when the transport took
 * it whole; 0 when not (*sent: the bytes that went, which the caller
 * queues the rest after); -1 when the endpoint failed.  req: the send
 * whose frame it is. */
int frames_send_now(slime_ep_t *ep, const slime_req_t *req, const frame_t *hdr, const void *payload, size_t *sent);
/* An F_EAGER header, in the short form where its length allows. */
frame_t frame_eager(uint64_t tag, uint64_t len);
/* The bytes of h on the wire (the short form's or the whole header). */
size_t frame_wire_size(const frame_t *h);
int frames_rx(slime_ep_t *ep);      /* >0 if it moved bytes */
/* proto.c */
void proto_on_header(slime_ep_t *ep);
void proto_on_payload(slime_ep_t *ep);
/* rx.parked, counted in ctx->n_parked. */
void proto_set_parked(slime_ep_t *ep, bool on);
void proto_deliver_imm(slime_ep_t *ep, uint32_t imm);
void proto_send_cts(slime_ep_t *ep, uint64_t sreq, slime_req_t *recv,
                    slime_status_t st);
/* The receiver of an FF_RDMA rendezvous fetched it: tells the sender. */
void proto_rndv_done(slime_ep_t *ep, uint64_t sreq, slime_status_t st);
bool proto_match_unexpected(slime_ctx_t *ctx, slime_req_t *req);
/* p2p_drop_unexpected under ctx->lock. */
size_t proto_drop_unexpected(slime_ctx_t *ctx, bool (*stale)(uint64_t tag, void *arg), void *arg);
void proto_post_rma(slime_ep_t *ep, slime_req_t *req);
/* After posting to ep's RMA queue (under ctx->lock): runs a small op at
 * its head now, on this thread, and hands the rest to the progress
 * engine.  slime_batch calls it once per endpoint, after all its posts. */
void proto_rma_start(slime_ep_t *ep);
int proto_rma_progress(slime_ep_t *ep);
void umsg_free(slime_ctx_t *ctx, umsg_t *m);
/* p2p_recv (ops.c). */
slime_status_t ep_recv_opts(slime_ep_t *ep, void *buf, size_t cap, uint64_t tag, const recv_opts_t *o,
                            slime_req_t **out);
/* combine.c: combining receives (slime_recv_reduce) */
/* A combining receive cannot take a message of len bytes (not a whole
 * number of elements). */
bool recv_misfit(const slime_req_t *r, uint64_t len);
/* Fails r for a message of len bytes that is too long or a misfit. */
void recv_refuse(slime_req_t *r, uint64_t len);
/* Lands a whole message held in memory in r: copied, or folded in. */
void recv_deliver(slime_req_t *r, const void *data, size_t len);
/* The payload loop's step for a combining receive: folds what the
 * transport has of the payload into the receive; bytes, 0, or < 0. */
ssize_t frames_rx_combine(slime_ep_t *ep);

/* ---- the context (ctx.c, progress.c) ---- */
enum pollable_kind { POLL_WAKE, POLL_LISTEN, POLL_PENDING, POLL_EP };
typedef struct pollable {
    enum pollable_kind kind;
    void *obj;                  /* POLL_LISTEN: its tp_slot_t */
} pollable_t;

/* A connection a listener accepted, until its handshake is done.  The
 * listener's transport reads the hello; the transport the hello names
 * takes over when it dials through that listener (transport_ops_t.via). */
typedef struct pending_conn {
    slime_list_t link;
    pollable_t pollable;
    int fd;
    const struct transport_ops *tp;
    uint64_t deadline_ns;
    size_t got;
    wire_hello_t hello;
    int xfd[2];                 /* fds that came with the hello, or -1 */
    uint32_t peer_pid;          /* from the kernel (SO_PEERCRED) where known */
    uint8_t extra[256];         /* what follows the hello, for its transport */
    size_t extra_got;
} pending_conn_t;

/* Wire ids of transports (transport/transport.h) are below this: they
 * index the context's slots. */
#define TRANSPORT_MAX 8

/* A transport in a context (transports.c). */
typedef struct tp_slot {
    /* the context's copy of its table, zero past the size it was built
     * with; NULL while the transport is not open in this context */
    const struct transport_ops *tp;
    void *state;                /* what its ctx_open made */
    size_t eager;               /* its eager limit */
    pollable_t listen;          /* its listener's events, if it has one */
    uint64_t rest_until;        /* ...which rests until then (0: it listens) */
} tp_slot_t;

struct slime_ctx {
    pthread_mutex_t lock;
    uint64_t id;                /* context_id(id_secret) (token.c) */
    uint8_t id_secret[SLIME_ID_SECRET];
    uint64_t proof, job;        /* from the token (token.c) */
    bool own_token;             /* none was given: a random one, in the address */
    int force;                  /* 0 auto, else the forced transport's wire id */
    tp_slot_t tps[TRANSPORT_MAX]; /* by wire id */
    wire_addr_t addr;
    int epfd, wakefd;
    int pt_epfd;                /* the progress thread sleeps here */
    pollable_t p_wake;
    slime_list_t pending_conns;
    size_t n_pending;           /* ...their number */
    int n_resting;              /* listeners resting (tp_slot_t.rest_until) */
    slime_list_t eps;
    slime_list_t accepted;      /* eps dialed by peers, not yet accepted */
    size_t n_fd_eps;            /* up eps whose transport is not TP_CAP_POLLED */
    _Atomic int n_local_eps;    /* up eps to a peer on this host (ctx_crowded) */
    unsigned poll_tick;
    bool poll_now;              /* look at the fds on the next pass */
    bool rma_batching;          /* slime_batch is posting: it starts the RMA queues */
    /* tag matching */
    slime_list_t posted;        /* slime_req_t via qlink */
    slime_list_t unexpected;    /* umsg_t */
    size_t unexp_bytes, unexp_cap;
    size_t peer_items_max;      /* DLSLIME_PEER_ITEMS_MAX (budget.c) */
    /* wire ids of requests */
    slime_req_t **ids;
    uint32_t *id_gen;
    uint32_t ids_cap, *id_free, n_free;
    /* memory */
    int mr_fd;
    mr_shared_t *mr_table;
    /* our regions by table slot: what the owner checks a peer's access
     * against, as peers map the shared table writable (to pin entries) */
    slime_mr_t **mr_slots;
    slime_list_t mrs;
    md_t *mds;                  /* memory domains open here (md.c) */
    unsigned n_mds;
    /* progress thread and waiters */
    pthread_t thread;
    _Atomic bool stop;
    _Atomic bool closed;        /* destroy failed every request: waiters leave */
    _Atomic int users;          /* threads inside ctx_wait_until */
    _Atomic int spinners;
    _Atomic bool pt_asleep;     /* the progress thread sleeps in epoll */
    _Atomic bool pt_long_sleep; /* ...and not for a short while only */
    bool midway;                /* under lock: a peer's write is half in */
    pthread_mutex_t sleep_mtx;
    pthread_cond_t sleep_cond;  /* requests completed, endpoints changed */
    _Atomic int sleepers;
    /* waiters on worker requests sleep apart: the many completions of a
     * collective's own transfers must not wake them */
    pthread_cond_t worker_cond;
    _Atomic int worker_sleepers;
    /* completers order their look at the sleepers with a compiler
     * barrier only: sleepers pay with membarrier(2) (wake_fence.c) */
    _Atomic bool light_wake;
    bool light_shared;          /* ...writers to shared boxes too */
    slime_list_t callbacks;     /* completed requests whose cb is due */
    /* copy team for large one-sided copies (team.c), started on first use */
    pthread_mutex_t team_mtx;
    _Atomic(team_t *) team;
    _Atomic bool team_failed;   /* no helpers to be had: copy alone */
    /* peer liveness (liveness.c), looked at by the progress thread */
    uint64_t silence_ns;        /* DLSLIME_PEER_SILENCE_MS; 0: never */
    uint64_t live_last_ns, live_next_ns;
    bool live_armed;            /* an endpoint waits on its peer */
    _Atomic uint64_t live_pings; /* SLIME_COUNTER_PEER_PINGS */
    int n_parked;               /* endpoints with rx.parked (proto_set_parked) */
    _Atomic uint64_t unexp_copies; /* SLIME_COUNTER_UNEXPECTED_COPIES */
    _Atomic uint64_t parks;     /* SLIME_COUNTER_PARKED */
    _Atomic uint64_t box_ops;   /* SLIME_COUNTER_BOX_OPS */
    _Atomic uint64_t rndv_sends; /* SLIME_COUNTER_RENDEZVOUS */
};

/* team.c: splits a chunked job between the calling thread and the
 * context's helper threads; returns when every chunk is done, with the
 * first chunk's failure if any.  fn runs on several threads at once and
 * must not take ctx->lock.  Runs alone when there are no helpers, when
 * total fits one chunk or when another job is running. */
typedef slime_status_t (*team_chunk_fn)(void *arg, size_t off, size_t len);
slime_status_t team_run(slime_ctx_t *ctx, team_chunk_fn fn, void *arg, size_t total, size_t chunk);
void team_destroy(team_t *team);

/* progress.c */
int progress_locked(slime_ctx_t *ctx);
/* Spins/sleeps until done() or the deadline; returns false on timeout. */
bool ctx_wait_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg,
                    uint64_t deadline_ns);
/* The same without spinning: for what only another thread completes. */
bool ctx_sleep_until(slime_ctx_t *ctx, bool (*done)(void *), void *arg,
                     uint64_t deadline_ns);
/* Wakes the threads asleep in ctx_wait_until, and with worker_sleepers
 * those in ctx_sleep_until too (a worker request completed). */
void ctx_wake(slime_ctx_t *ctx, bool worker_sleepers);
void ctx_wake_sleepers(slime_ctx_t *ctx); /* ctx_wake(ctx, false) */

/* wake_fence.c: the fences between a completion and a sleeper */
/* Sets light_wake and light_shared: what this process may skip. */
void wake_fence_register(slime_ctx_t *ctx);
/* Between a completer's store and its look at the sleepers. */
void wake_fence_completer(slime_ctx_t *ctx);
/* Between a sleeper's count and its look at what it waits for; false
 * when the completers' fences could not be covered (sleep briefly). */
bool wake_fence_sleeper(slime_ctx_t *ctx);
void ctx_kick(slime_ctx_t *ctx);
/* A thread of ours just posted or looked for its work and will look
 * again soon: peers may skip doorbells a while (mr_shared_t.grace_until). */
void ctx_extend_grace(slime_ctx_t *ctx);
/* More of our processes on this host (this one, and the peers of its up
 * endpoints there) than CPUs for this one: a peer we wait on may then be
 * off its core, waiting for ours. */
bool ctx_crowded(const slime_ctx_t *ctx);
/* A progress thread in its long sleep (which only an fd or a doorbell
 * ends) is kicked: something now needs it to look sooner. */
void ctx_rouse_long_sleeper(slime_ctx_t *ctx);
/* Call after queueing work only the progress engine will finish. */
void ctx_post_work(slime_ctx_t *ctx);
void *progress_thread_main(void *arg);
/* Runs due callbacks (progress thread only, ctx->lock not held). */
void run_callbacks(slime_ctx_t *ctx);
void epoll_update(slime_ctx_t *ctx, slime_ep_t *ep);

/* liveness.c */
/* DLSLIME_PEER_SILENCE_MS, in ns (the default where unset). */
slime_status_t live_silence_env(uint64_t *silence_ns);
/* Under ctx->lock, when ctx->live_next_ns is due: pings the silent peers
 * we wait on, fails those that did not answer. */
void live_check(slime_ctx_t *ctx, uint64_t now);
/* The progress thread's sleep of ms, shortened to the next look. */
int live_sleep_ms(slime_ctx_t *ctx, int ms);
/* proto.c's handlers of F_PING and F_PONG. */
bool live_on_ping(slime_ep_t *ep, const frame_t *h);
bool live_on_pong(slime_ep_t *ep, const frame_t *h);

/* token.c */
uint64_t token_digest(const char *domain, const void *tok, size_t len);
/* ctx->proof and ->job from the token (tok, len; NULL: none given),
 * else $DLSLIME_TOKEN, else a random token of the context's own
 * (ctx->own_token). */
void token_init(slime_ctx_t *ctx, const void *tok, size_t len);
uint64_t random_u64(void);
/* A context's id: the digest of its secret (what a hello proves it by). */
uint64_t context_id(const uint8_t secret[SLIME_ID_SECRET]);
/* A fresh secret, and ctx->id from it. */
void context_id_init(slime_ctx_t *ctx);
/* sha256.c */
void sha256(const void *data, size_t len, uint8_t out[32]);

/* transports.c: the provider table's transports in a context */
/* The transport named name ("auto": *force 0), as ctx->force. */
slime_status_t transports_parse(const char *name, int *force);
/* Opens every transport of the provider table that serves this context
 * and fills its part of ctx->addr; on failure none is left open. */
slime_status_t transports_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts);
/* After every endpoint is freed and every MR unregistered. */
void transports_close(slime_ctx_t *ctx);
/* The transport to dial the peer at addr by: the forced one, else the
 * open one that reaches it best. */
slime_status_t transports_choose(slime_ctx_t *ctx, const wire_addr_t *peer,
                                 const struct transport_ops **out);
/* A listener is readable: accepts, or rests a while when out of fds. */
void transports_accept(slime_ctx_t *ctx, tp_slot_t *s);
/* Under ctx->lock: listens again on the listeners whose rest is over. */
void transports_wake_listeners(slime_ctx_t *ctx);
/* slime_ctx_counter: the sum of the open transports' answers. */
uint64_t transports_counter(const slime_ctx_t *ctx, slime_counter_t which);
/* The open transport of wire id id, or NULL. */
static inline const struct transport_ops *ctx_tp(const slime_ctx_t *ctx, unsigned id) {
    return id < TRANSPORT_MAX ? ctx->tps[id].tp : NULL;
}
/* Its per-context state, or NULL while it is not open. */
static inline void *ctx_tp_state(const slime_ctx_t *ctx, unsigned id) {
    return id < TRANSPORT_MAX ? ctx->tps[id].state : NULL;
}

/* address.c */
/* Fills what every address has; each open transport adds its part. */
void address_init(slime_ctx_t *ctx);
slime_status_t address_parse(const void *buf, size_t len, wire_addr_t *out);
bool address_same_host(const wire_addr_t *a, const wire_addr_t *b);

/* handshake.c */
/* The hello to the peer at *peer: the proof its address asks for (its
 * capability) or else ours. */
void hello_fill(const slime_ctx_t *ctx, const wire_addr_t *peer, int transport, wire_hello_t *h);
slime_status_t welcome_check(const slime_ctx_t *ctx, const wire_welcome_t *w);
/* Decides what an acceptor does with a complete hello that came through
 * a listener and now rests with transport (a wire id), under ctx->lock:
 * returns the ep to attach the connection to, or NULL with w filled. */
slime_ep_t *hello_accept(slime_ctx_t *ctx, const wire_hello_t *h, int transport,
                         wire_welcome_t *w);
/* An fd the listener of transport (a wire id, open here) accepted. */
void pending_conn_add(slime_ctx_t *ctx, int fd, int transport);
void pending_conn_progress(slime_ctx_t *ctx, pending_conn_t *pc);
int pending_conn_expire(slime_ctx_t *ctx);
void pending_conn_close(slime_ctx_t *ctx, pending_conn_t *pc);
/* Drops up to n of the oldest unauthenticated connections; how many. */
size_t pending_conn_evict(slime_ctx_t *ctx, size_t n);

#endif
