/* Communicators and collectives: the objects shared by csrc/coll/.
 *
 * A communicator owns one worker thread that runs its collectives one at
 * a time, in post order.  Everything a collective sends travels with the
 * public send/recv API in the communicator's tag space:
 *
 *   bits 63..48  comm id
 *   bits 47..40  epoch: tells a communicator apart from an earlier one
 *                with the same id, whose messages may still be in flight
 *   bit  39      1: collective traffic, 0: slime_comm_send/recv
 *   bits 38..23  (collective) sequence number of the collective
 *   bits 22..0   (collective) step of its algorithm
 *
 * Step values stop one short of all ones: the tag whose low 39 bits are
 * all ones carries abort notices (abort.c).  Sequence numbers wrap: two
 * collectives 2^16 apart share tags, which is harmless because messages
 * of one tag between a pair match in the order sent. */
#ifndef SLIME_COLL_H
#define SLIME_COLL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/p2p.h"
#include "core/util.h"

#define COLL_ID_SHIFT 48
#define COLL_EPOCH_SHIFT 40
#define COLL_EPOCH_MAX 0xffu
#define COLL_FLAG (1ull << 39)
#define COLL_SEQ_BITS 16
#define COLL_STEP_BITS 23
#define COLL_STEP_LIMIT ((1u << COLL_STEP_BITS) - 1) /* steps wrap below it */
#define COLL_USER_TAG_MAX ((1ull << 39) - 1)

/* What a failing rank tells the others (abort.c). */
typedef struct abort_msg {
    int32_t status;
    int32_t rank;
    char text[504];
} abort_msg_t;

struct coll_op;

struct slime_comm {
    slime_ctx_t *ctx;
    uint32_t id;
    uint32_t epoch;
    int rank, size;
    slime_ep_t **peers;             /* peers[rank] == NULL */
    _Atomic int64_t timeout_ms;

    /* mu guards the queue, the worker's life and the broken state */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slime_list_t queue;             /* coll_op_t, in post order */
    uint64_t next_seq;
    bool worker_started, stopping;
    bool running;                   /* a collective runs (worker or waiter) */
    bool worker_watching;           /* the worker sleeps until a queued one is due */
    pthread_t worker;
    /* a finished collective's op, kept for the next post (one malloc and
     * free fewer per collective) */
    struct coll_op *spare_op;
    slime_status_t broken;          /* SLIME_OK until a collective fails */
    char broken_text[512];
    /* destroy has begun: the running collective gives up at once */
    _Atomic bool closing;

    /* the abort channel: one receive from any member, posted at create */
    slime_req_t *abort_req;
    abort_msg_t abort_in;
    /* notices this rank sent; they must outlive their sends */
    abort_msg_t *abort_out;
    slime_req_t **abort_sends;      /* size entries */

    /* two ranks on one host: small collectives through a shared box
     * (pairbox.c); whoever runs the collective uses it */
    enum { PAIRBOX_UNKNOWN, PAIRBOX_ON, PAIRBOX_OFF } box_state;
    p2p_box_t box;
    uint64_t box_seq;               /* the last message's number */
    uint64_t box_written[2];        /* our last message in each large buffer of our side */
    uint64_t box_peer_done;         /* the peer read our messages up to this one */

    /* whether every link of the ring may read (ring.c): agreed on by
     * all ranks at the first ring that could read its links */
    enum { READ_LINKS_UNKNOWN, READ_LINKS_ALL, READ_LINKS_NOT_ALL } read_links;

    /* the worker's alone */
    void *scratch;
    size_t scratch_cap;
    void *rma_scratch;
    size_t rma_scratch_cap;
    slime_mr_t *rma_scratch_mr;
};

/* One queued collective: its arguments, copied at post time. */
typedef struct coll_op coll_op_t;
typedef struct coll_run coll_run_t;
/* Block address arrays of up to this many ranks live in the op itself:
 * two ranks (their box collectives are the ones whose allocation counts,
 * and the tests' 3- and 4-rank cases keep the allocated path run). */
#define COLL_BLOCKS_SMALL 2
typedef bool (*coll_exec_fn)(coll_run_t *run, const coll_op_t *op);

struct coll_op {
    slime_list_t link;
    coll_exec_fn exec;
    const char *name;
    slime_req_t *req;
    uint64_t seq;
    bool typed;                     /* count / dtype / redop describe it */
    uint64_t posted_ns;             /* the worker leaves it to its poster a moment */
    bool lazy;                      /* posted without waking the worker (its poster waits) */
    /* arguments, as each collective uses them */
    void *buf;
    const void *src;
    void *dst;
    size_t count;                   /* elements */
    size_t bytes;
    slime_dtype_t dtype;
    slime_redop_t redop;
    int root;
    size_t *v;                      /* alltoallv: 4 * size entries, owned */
    void **ptrs;                    /* size per-block addresses: ptrs_small or owned (NULL: none) */
    void *ptrs_small[COLL_BLOCKS_SMALL]; /* ptrs of a small communicator: no allocation per post */
};

/* ---- comm.c ---- */
/* The bits every tag of this communicator starts with. */
static inline uint64_t comm_tag_base(const slime_comm_t *c) {
    return (uint64_t)c->id << COLL_ID_SHIFT | (uint64_t)c->epoch << COLL_EPOCH_SHIFT;
}
static inline uint64_t comm_user_tag(const slime_comm_t *c, uint64_t tag) {
    return comm_tag_base(c) | tag;
}
static inline uint64_t comm_coll_tag(const slime_comm_t *c, uint64_t seq, uint32_t step) {
    return comm_tag_base(c) | COLL_FLAG |
           (seq & ((1ull << COLL_SEQ_BITS) - 1)) << COLL_STEP_BITS | (step % COLL_STEP_LIMIT);
}
static inline uint64_t comm_abort_tag(const slime_comm_t *c) {
    return comm_tag_base(c) | COLL_FLAG | COLL_USER_TAG_MAX;
}
/* The rank whose endpoint is ep, or -1. */
int comm_rank_of(const slime_comm_t *comm, const slime_ep_t *ep);
/* A scratch area of at least len bytes owned by the worker (cached). */
void *comm_scratch(slime_comm_t *comm, size_t len);
/* Another one, registered for one-sided reads into it (cached); NULL if
 * it cannot be had. */
void *comm_rma_scratch(slime_comm_t *comm, size_t len, slime_mr_t **mr);

/* ---- blocks.c ---- */
/* Checks that none of the n blocks is NULL (when amount > 0) and copies
 * the array for the op (*copy NULL when amount is 0: nothing moves):
 * into small (COLL_BLOCKS_SMALL entries, an op's ptrs_small) when it
 * fits, else into a malloc'd array.  what: "dst block"; unit: "bytes" or
 * "elements", for the error text. */
slime_status_t coll_copy_blocks(const char *name, const char *what, const void *const *blocks, int n,
                                size_t amount, const char *unit, void **small, void ***copy);
/* n addresses base + q * stride (all base when base is NULL or stride
 * 0): in small (COLL_BLOCKS_SMALL entries) when they fit, else malloc'd;
 * NULL with the error set when out of memory.  coll_blocks_free frees it. */
const void **coll_flat_blocks(const void *base, int n, size_t stride, const void **small);
/* Frees an array of coll_copy_blocks or coll_flat_blocks unless it is small. */
void coll_blocks_free(const void *blocks, const void *small);

/* ---- worker.c ---- */
/* What the op is, for error texts: "allreduce #3 (1000 x float32, sum)".
 * Written only when needed: formatting it at every post cost a small
 * collective a noticeable part of its time. */
typedef struct coll_what { char text[160]; } coll_what_t;
coll_what_t coll_what(const coll_op_t *op);
/* Checks the common arguments (comm, out) and the root if root_used. */
slime_status_t coll_check(const slime_comm_t *comm, slime_req_t **out, const char *name,
                          bool root_used, int root);
/* Takes a filled template (exec, name, args), queues a copy and hands
 * back its request.  Ownership of v and ptrs passes to the queue, also
 * on failure. */
slime_status_t coll_post(slime_comm_t *comm, const coll_op_t *tmpl, slime_req_t **out);
void coll_worker_stop(slime_comm_t *comm);
/* The communicators alive, for waiters that run a queued collective
 * themselves: added at create, removed before destroy stops anything. */
bool coll_live_add(slime_comm_t *comm);
void coll_live_remove(slime_comm_t *comm);

/* ---- abort.c ---- */
slime_status_t abort_channel_open(slime_comm_t *comm);
void abort_channel_close(slime_comm_t *comm);
/* Non-zero status (and its text) if a member's abort notice arrived. */
slime_status_t abort_received(slime_comm_t *comm, char *text, size_t len);
/* Tells every reachable member this rank failed. */
void abort_broadcast(slime_comm_t *comm, slime_status_t st, const char *text);
/* Marks the communicator broken (the first failure wins) and, unless
 * destroy is the cause, tells the other members. */
void comm_break(slime_comm_t *comm, slime_status_t st, const char *text);

/* ---- exchange.c: the messages of the collective being run ---- */
typedef struct xfer {
    slime_req_t *req;               /* NULL: slot free */
    int peer;
    uint32_t step;
    bool is_recv;
    bool is_read;                   /* a one-sided read from peer */
    size_t expect;                  /* receives: the bytes it must get */
} xfer_t;

struct coll_run { /* run_init sets every field */
    slime_comm_t *comm;
    const coll_op_t *op;
    uint64_t deadline_ns;           /* 0 until run_deadline sets it */
    int64_t timeout_ms;
    const char *phase;              /* the algorithm's current part */
    xfer_t *x;
    size_t nx, cap;                 /* slots in use up to nx */
    slime_status_t status;
    char detail[1024];
};

void run_init(coll_run_t *r, slime_comm_t *comm, const coll_op_t *op);
/* When the collective times out: its timeout after its first wait (now,
 * at the first call), so that one that never waits reads no clock. */
uint64_t run_deadline(coll_run_t *r, uint64_t now);
/* Post one message of this collective; a handle, or -1 once failed. */
int run_send(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len);
/* run_send of a message whose receive is posted already, or nearly
 * always is (send_opts_t.recv_posted): eager past the eager size too,
 * where a rendezvous would offer no single copy. */
int run_send_to_posted(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len);
/* run_send for a sender that could run ahead of its receiver (a rank
 * that only sends): every COLL_AHEAD_MAX-th collective it completes only
 * once the receiver took the bytes (send_opts_t.sync), so that such a rank
 * is never more than that many collectives ahead. */
#define COLL_AHEAD_MAX 64
int run_send_bounded(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len);
/* run_send_bounded that also, from coll_sync_bytes() on, to a peer that
 * can copy straight from our memory (shm), and while the communicator has
 * no more ranks than we have cores, always completes only once the
 * receiver took the bytes, so that each message is copied once, into its
 * receive, rather than queued and copied twice. */
int run_send_sync(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len);
/* Whether mine holds on every rank (an AND over the communicator, by
 * recursive doubling of a byte, allreduce.c); false if the run failed. */
bool run_agree_all(coll_run_t *r, bool mine, bool *all);
/* run_send of a chunk its receiver copies as it is (into its place, or
 * kept false: into a scratch slot to combine), which, from
 * KEPT_CHUNK_FETCH_MIN (kept) or CHUNK_FETCH_MIN up to CHUNK_FETCH_MAX
 * bytes (exchange.c), with no more ranks than cores, to a peer that can
 * copy it straight from our memory (shm), goes by rendezvous: the
 * receiver fetches it, one copy where the stream makes two.  The send
 * completes once it has.  Else (posted) it goes as run_send_to_posted
 * does. */
int run_send_fetched(coll_run_t *r, int peer, uint32_t step, const void *buf, size_t len, bool posted, bool kept);
int run_recv(coll_run_t *r, int peer, uint32_t step, void *buf, size_t len);
/* run_recv into a piece of a large buffer that nobody reads before the
 * collective ends (recv_opts_t.cold): shm stores it past the cache. */
int run_recv_cold(coll_run_t *r, int peer, uint32_t step, void *buf, size_t len);
/* A receive that reduces the count elements it gets into buf with op
 * (AVG as SUM) instead of copying them (slime_recv_reduce). */
int run_recv_reduce(coll_run_t *r, int peer, uint32_t step, void *buf, size_t count, slime_dtype_t dt,
                    slime_redop_t op);
/* One-sided: len bytes of peer's region `remote` at roff into local at off. */
int run_read(coll_run_t *r, int peer, uint32_t step, slime_mr_t *local, size_t off,
             const slime_mr_desc_t *remote, size_t roff, size_t len);
/* Waits for the given handles (frees them) until the deadline; returns
 * false as soon as any message of the run fails, the deadline passes, a
 * member aborts or the communicator is destroyed. */
bool run_wait(coll_run_t *r, const int *h, size_t n);
static inline bool run_wait_one(coll_run_t *r, int h) { return run_wait(r, &h, 1); }
bool run_wait_all(coll_run_t *r);
/* Without waiting: frees h if it completed well; true if it did. */
bool run_test(coll_run_t *r, int h);
/* recv from `from` and send to `to` at once, then wait for both. */
bool run_exchange(coll_run_t *r, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                  size_t rlen, uint32_t step);
/* Fails the run (false) when destroy began or a member's abort notice
 * came in (told and its text, from abort_received); true otherwise. */
bool run_check_members(coll_run_t *r, slime_status_t told, const char *text);
/* Records a failure found by the algorithm itself. */
bool run_fail(coll_run_t *r, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Releases every message still outstanding (after a failure: cancels
 * receives, gives sends a short grace, then detaches them). */
void run_release(coll_run_t *r);
static inline bool run_ok(const coll_run_t *r) { return r->status == SLIME_OK; }

/* ---- ring.c: the pipelined ring over n blocks ---- */
enum ring_mode {
    RING_INPLACE,                   /* blocks of buf: reduce steps, then copy steps */
    RING_FROM_SRC,                  /* reduce_scatter: const src blocks, result to dst */
};

typedef struct ring_plan {
    enum ring_mode mode;
    uint8_t *buf;                   /* INPLACE: the blocks */
    const uint8_t *src;             /* FROM_SRC: the blocks */
    /* optional, n entries: block b is at blocks[b] (INPLACE) or
     * src_blocks[b] (FROM_SRC) instead of at its offset in buf or src,
     * so that a list of tensors needs no flat staging copy */
    uint8_t *const *blocks;
    const uint8_t *const *src_blocks;
    uint8_t *dst;                   /* FROM_SRC: this rank's result block */
    /* INPLACE, optional: where step 0 reads this rank's own block from
     * (an out-of-place allgather's input, apart from every block), which
     * ring_run copies into its place once step 0 is posted */
    const uint8_t *own_src;
    size_t total;                   /* elements over all blocks */
    size_t esize;
    slime_dtype_t dtype;            /* reduce steps only */
    slime_redop_t redop;
    int shift;                      /* step s sends block rank + shift - s */
    int steps;                      /* how many steps */
    int reduce_steps;               /* the first ones reduce, the rest copy */
    bool avg;                       /* divide the block finished at the last reduce step */
} ring_plan_t;

bool ring_run(coll_run_t *r, const ring_plan_t *p);
/* Block b's range (elements) under plan p. */
void ring_block(const ring_plan_t *p, int n, int b, size_t *off, size_t *len);
/* Where element `first` of block b lives (INPLACE: in buf or blocks;
 * FROM_SRC: in src or src_blocks). */
uint8_t *ring_at(const ring_plan_t *p, int n, int b, size_t first);
const uint8_t *ring_src_at(const ring_plan_t *p, int n, int b, size_t first);

/* ---- pairbox.c: two ranks on one host, small collectives through a shared box ---- */
/* Whether the collective being run moves its bytes (each rank's, at most
 * coll_pair_box_bytes()) through the box.  The first time, the two ranks
 * agree on one (a message each way): false also when that failed, which
 * run_ok tells. */
bool pairbox_usable(coll_run_t *r, size_t bytes);
/* At destroy: gives the box back. */
void pairbox_close(slime_comm_t *comm);
/* The most bytes one message carries. */
size_t pairbox_cap(const slime_comm_t *comm);
/* Writes message seq (len <= cap bytes, of a collective of total bytes)
 * into our side, once the peer is done with the buffer's last one. */
bool pairbox_put(coll_run_t *r, uint64_t seq, const void *data, size_t len, uint64_t total);
/* The peer's message seq (len bytes), once it is there, of a collective
 * of total bytes at both ranks; NULL if the run failed. */
const uint8_t *pairbox_get(coll_run_t *r, uint64_t seq, size_t len, uint64_t total);
/* We are done reading the peer's message seq: its buffer is the peer's again. */
void pairbox_release(slime_comm_t *comm, uint64_t seq);

/* ---- pairbox_ops.c: the collectives a box carries (pairbox_usable first) ---- */
bool pairbox_allreduce(coll_run_t *r, const coll_op_t *op);
bool pairbox_broadcast(coll_run_t *r, const coll_op_t *op);
bool pairbox_allgather(coll_run_t *r, const coll_op_t *op);
bool pairbox_reduce_scatter(coll_run_t *r, const coll_op_t *op);
bool pairbox_barrier(coll_run_t *r);

/* ---- tuning (tuning.c) ---- */
size_t coll_chunk_bytes(void);      /* pipeline unit; $DLSLIME_COLL_CHUNK */
size_t coll_small_bytes(void);      /* latency algorithms up to this; $DLSLIME_COLL_SMALL */
size_t coll_pair_small_bytes(void); /* the same for a 2-rank all_reduce over shm; $DLSLIME_COLL_SMALL_PAIR */
/* Two ranks on one host move up to this many bytes each through a shared
 * box ($DLSLIME_PAIR_BOX_MAX; DLSLIME_PAIR_BOX=0: never) */
size_t coll_pair_box_bytes(void);
/* run_send_sync goes by rendezvous from this size; $DLSLIME_COLL_SYNC_MIN */
size_t coll_sync_bytes(void);
/* In-place rings of at least this many bytes, on a communicator of
 * comm_size ranks, may move chunks by one-sided reads: reducing ones
 * (all_reduce) from $DLSLIME_COLL_CMA_MIN (default 2 MiB, 1 MiB with more
 * ranks than the host has online cores), copying ones (allgather) from
 * $DLSLIME_COLL_CMA_COPY_MIN (4 MiB, 128 KiB so).  These knobs must be
 * the same on every rank. */
size_t coll_cma_min_bytes(int comm_size);
size_t coll_cma_copy_min_bytes(int comm_size);

/* ---- dtype.c ---- */
const char *dtype_name(slime_dtype_t dt);
const char *redop_name(slime_redop_t op);
/* Checks dtype and op for a reducing collective (INVAL / UNSUPPORTED). */
slime_status_t coll_check_reduce(const char *name, slime_dtype_t dt, slime_redop_t op);

/* ---- the collectives' bodies ---- */
static inline int mod_rank(int x, int n) { return ((x % n) + n) % n; }
/* Whether two ranges of len bytes share a byte. */
static inline bool coll_overlaps(const void *a, const void *b, size_t len) {
    const uint8_t *x = a, *y = b;
    return len && x < y + len && y < x + len;
}

#endif
