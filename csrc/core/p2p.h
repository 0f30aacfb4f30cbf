/* What the collectives (csrc/coll/) and SlimeRPC (csrc/rpc/) are built on.
 *
 * They move bytes with the public API (slime_send, slime_recv,
 * slime_recv_any, slime_read, slime_req_*, slime_mr_*) and need only the
 * few things below besides, which the public API does not offer.  The
 * core's objects stay opaque to them: nothing above this header reads a
 * field of a core struct, so the core may change its structs (and its
 * transports) without touching a collective.  Lists, clocks and the
 * environment helpers are in core/util.h. */
#ifndef SLIME_P2P_H
#define SLIME_P2P_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlslime/dlslime.h"

/* ---- errors (status.c): only the function that first sees one records it ---- */
slime_status_t slime_errorf(slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
slime_status_t slime_verrorf(slime_status_t st, const char *fmt, va_list ap);

/* ---- waiting on a peer ---- */
/* A thread waiting on a peer spins this long without news before it
 * sleeps, yielding its core at every turn after the first
 * P2P_WAIT_YIELD_NS (on an oversubscribed machine the peer may need it):
 * the core's waits (progress.c) and a box's (coll/pairbox.c) alike. */
#define P2P_WAIT_SPIN_NS 200000ull
#define P2P_WAIT_YIELD_NS 3000ull

/* ---- receives with options (combine.c folds, the transports store) ---- */
/* acc[i] = acc[i] op in[i] over n elements (the ranges do not overlap) */
typedef void (*slime_combine_fn)(void *acc, const void *in, size_t n);

/* How a receive of the library's own lands its payload. */
typedef struct recv_opts {
    /* non-NULL: fold the payload into buf with combine (combine.c),
     * elements of esize bytes (at most 16, buf aligned for them); this
     * is how slime_recv_reduce receives and reduces in one pass */
    slime_combine_fn combine;
    size_t esize;
    /* buf is a piece of a larger buffer that is still filling and will
     * not be read soon (a collective's chunk): a transport may store
     * past the cache, as it does for a large receive */
    bool cold;
} recv_opts_t;

/* slime_recv with the options o. */
slime_status_t p2p_recv(slime_ep_t *ep, void *buf, size_t cap, uint64_t tag, const recv_opts_t *o,
                        slime_req_t **out);

/* Which way a rendezvous's bytes may go where the receiver could copy
 * them straight out of the sender's memory (shm_fetch.c). */
typedef enum send_path {
    /* as the transport sees fit (a point-to-point send): over shm,
     * fetched on a crowded host, and the largest on any host */
    SEND_PATH_ANY,
    /* by the connection's stream: a collective's chunk, whose pipeline
     * keeps both ends copying anyway */
    SEND_PATH_STREAM,
    /* fetched wherever the receiver may: a whole buffer its sender waits
     * on (a broadcast's root), which no pipeline keeps the sender busy
     * through */
    SEND_PATH_FETCH,
} send_path_t;

typedef struct send_opts {
    /* complete only once the receiver has taken the bytes: by rendezvous
     * whatever the size (MPI's synchronous send).  For a sender that
     * would otherwise run ahead of its receiver, as a broadcast's root in
     * a loop does: a message that comes before its receive is copied
     * twice (into a buffer of the receiver's, then out), where a
     * rendezvous copies it once, and the receiver then drains a backlog
     * instead of taking each message as it comes. */
    bool sync;
    /* the receive is posted before this send, or nearly always is (a
     * ring's chunks, when the run's every receive is posted before its
     * first send): past the eager size the send still goes eagerly where
     * its rendezvous would offer the receiver no single copy, as it then
     * only costs a round trip.  A late receiver copies it twice, as any
     * early eager message, within the unexpected-bytes cap. */
    bool recv_posted;
    send_path_t path;
    /* a reducing collective's chunk: its receiver reduces it (a ring
     * all_reduce's straight out of the stream, piece by piece) and sends
     * chunks of its own meanwhile, so the bytes go in the transport's
     * large pieces (shm: more publishes only cost the reducer looks; see
     * shm_writev) */
    bool coarse;
} send_opts_t;

/* slime_send with the options o. */
slime_status_t p2p_send(slime_ep_t *ep, const void *buf, size_t len, uint64_t tag, const send_opts_t *o,
                        slime_req_t **out);

/* ---- requests and waiting ---- */
/* SLIME_INPROGRESS or the final status, with no side effect: unlike
 * slime_req_test it neither drives progress nor records an error, so a
 * wait predicate may call it. */
slime_status_t p2p_req_state(const slime_req_t *req);
static inline bool p2p_req_done(const slime_req_t *req) { return p2p_req_state(req) != SLIME_INPROGRESS; }

/* Drives progress (spinning, then sleeping) until done(arg) or the
 * deadline (CLOCK_MONOTONIC ns); false on timeout.  done runs under the
 * core's sleep mutex: it may only look, never post or block. */
bool p2p_wait_until(slime_ctx_t *ctx, bool (*done)(void *arg), void *arg, uint64_t deadline_ns);
/* Something a waiter's done() looks at changed outside the core (a flag
 * of the caller's): wakes the threads asleep in p2p_wait_until. */
void p2p_wake_waiters(slime_ctx_t *ctx);

/* Requests that a thread of the library completes (a collective's):
 * whoever waits on one sleeps instead of spinning, since polling would
 * not help it.  run_here (may be NULL) is called by a waiter first, with
 * arg and the wait's timeout: it may do the work right there, in the
 * waiting thread, and then returns true (the request is complete); false:
 * the waiter sleeps, and the work must then be under way elsewhere.
 * Timeout P2P_NO_WAITER: nobody will wait (the request is being freed, or
 * a callback takes its completion); it must not run the work but see
 * that it runs. */
#define P2P_NO_WAITER (-1)
typedef bool (*p2p_run_here_fn)(slime_req_t *req, void *arg, int64_t wait_ms);
slime_req_t *p2p_req_worker_new(slime_ctx_t *ctx, p2p_run_here_fn run_here, void *arg);
/* Completes a worker request; fmt may be NULL on success. */
void p2p_req_worker_complete(slime_req_t *req, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- contexts ---- */
/* Drops every queued unexpected message whose tag stale() says is dead (a
 * destroyed communicator's); the sender of an announced (rendezvous) one
 * gets SLIME_ERR_CANCELED.  Takes the context's lock; returns how many. */
size_t p2p_drop_unexpected(slime_ctx_t *ctx, bool (*stale)(uint64_t tag, void *arg), void *arg);

/* ---- endpoints ---- */
slime_ctx_t *p2p_ep_ctx(const slime_ep_t *ep);
/* Disconnects a peer that broke a rule of a layer above the core (an
 * RPC budget): ep goes down with st and the reason fmt, its pending
 * requests fail, and every later one says why, naming the peer. */
void p2p_ep_fail(slime_ep_t *ep, slime_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Why ep went down ("" while it is up); as long-lived as ep. */
const char *p2p_ep_down_reason(const slime_ep_t *ep);

/* What an endpoint's transport can do, for the algorithms that choose a
 * path by it (bits, so that a transport can answer several). */
typedef enum p2p_cap {
    /* one-sided ops on this endpoint are copied by this process's CPU
     * from/to the peer's memory (no NIC, no peer thread): a read costs one
     * copy, where a message through a shared ring costs two */
    P2P_CAP_CPU_RMA = 1u << 0,
} p2p_cap_t;
bool p2p_ep_can(const slime_ep_t *ep, p2p_cap_t cap);
/* The CPUs this process may run on (its affinity mask, read once). */
int p2p_affinity_cpus(void);

/* ---- shared boxes (core/box.c) ---- */
/* A few areas of memory that both processes of a same-host connection map
 * (the shm transport's), for a layer above the core to lay out and poll
 * by itself, with no request, frame or lock: a small collective of two
 * ranks costs a cache line each way that way (coll/pairbox.c).  A box
 * has a side per process, len bytes each: this one writes `mine`, which
 * the peer reads, and reads `theirs`.  Slots are numbered alike at both
 * ends, but each end claims them on its own: the layer above agrees on
 * one with the peer.  Whatever is in `theirs` is the peer's to write at
 * any time: read it as untrusted. */
typedef struct p2p_box {
    uint8_t *mine;
    const uint8_t *theirs;
    size_t len;
    int slot;
    slime_ep_t *ep;                 /* referred to while open */
    void *hold;                     /* the transport's: keeps the memory mapped */
} p2p_box_t;
/* Reserves every slot free here and returns them, a bit each: 0 when
 * there are none (the transport has no boxes, the endpoint is down). */
uint32_t p2p_box_reserve(slime_ep_t *ep);
/* Gives back reserved slots that will not be opened. */
void p2p_box_unreserve(slime_ep_t *ep, uint32_t slots);
/* Opens a slot p2p_box_reserve gave: *box stays mapped, and ep alive,
 * until p2p_box_close, even after the connection is gone.  False (the
 * slot given back) if the endpoint went down meanwhile. */
bool p2p_box_open(slime_ep_t *ep, int slot, p2p_box_t *box);
void p2p_box_close(p2p_box_t *box);
/* Brackets a wait on ep's peer that the core does not see (on a box):
 * peer liveness watches the peer meanwhile, as it does for a receive,
 * so a stopped peer fails ep within the silence limit. */
void p2p_ep_wait_begin(slime_ep_t *ep);
void p2p_ep_wait_end(slime_ep_t *ep);
/* One more collective that went through a box (SLIME_COUNTER_BOX_OPS). */
void p2p_count_box_op(slime_ctx_t *ctx);
/* The order between a box's writer and a reader asleep on it
 * (core/wake_fence.c): the writer's, after its store and before its look
 * at the reader's sleep flag; the sleeper's, after raising its flag and
 * before its last look, false when the writers could not be covered
 * (then sleep briefly). */
void p2p_shared_fence_writer(const slime_ctx_t *ctx);
bool p2p_shared_fence_sleeper(void);

#endif
