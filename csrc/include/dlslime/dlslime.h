/*
 * dlslime.h - the one public header of libdlslime, the dlslime-torch
 * transfer core.
 *
 * Objects
 *   slime_ctx_t  a process's engine: listeners, progress thread, MR table.
 *   slime_ep_t   a connection to one peer context (shm, tcp or verbs).
 *   slime_mr_t   a registered memory region.
 *   slime_mr_desc_t  the serialisable remote view of an MR (64 plain bytes:
 *                copy it, send it, pickle it).
 *   slime_req_t  one in-flight operation.
 *
 * Ownership
 *   The caller owns a context (slime_ctx_destroy), every MR it registers
 *   (slime_mr_dereg) and every request it is handed (slime_req_free).
 *   Endpoints belong to their context: slime_ep_close is optional, and
 *   slime_ctx_destroy closes and frees the rest.  Buffers passed to an
 *   operation must stay valid until its request completes.
 *
 * Threads
 *   Every function is thread-safe.  A context runs one progress thread;
 *   a thread waiting on a request also drives progress while it spins, so
 *   short operations complete without a thread hand-off.
 *
 * Errors
 *   Functions return slime_status_t.  When one fails, slime_last_error()
 *   gives a detail text for the calling thread; a failed request keeps its
 *   own text in slime_req_error().
 *
 * Timeouts
 *   Every call that can block takes timeout_ms.  A negative timeout is an
 *   error (SLIME_ERR_INVAL): nothing in the library waits forever.
 */
#ifndef DLSLIME_H
#define DLSLIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIME_VERSION_MAJOR 0
#define SLIME_VERSION_MINOR 1
/* Wire version: peers with a different one are refused at the handshake. */
#define SLIME_WIRE_VERSION 6

#if defined(__GNUC__)
#define SLIME_API __attribute__((visibility("default")))
#else
#define SLIME_API
#endif

/* ------------------------------------------------------------------ */
/* Status codes                                                        */
/* ------------------------------------------------------------------ */

typedef enum slime_status {
    SLIME_OK = 0,
    SLIME_INPROGRESS = 1,        /* request has not completed yet */
    SLIME_ERR_INVAL = -1,        /* bad argument */
    SLIME_ERR_NOMEM = -2,        /* out of memory */
    SLIME_ERR_TIMEOUT = -3,      /* the wait ran past its timeout */
    SLIME_ERR_PEER_LOST = -4,    /* the peer died or the connection broke */
    SLIME_ERR_REFUSED = -5,      /* handshake refused: magic, version, token */
    SLIME_ERR_ACCESS = -6,       /* unregistered, deregistered, out of bounds
                                    or not permitted memory */
    SLIME_ERR_TRUNCATED = -7,    /* message larger than the receive buffer */
    SLIME_ERR_CANCELED = -8,     /* request canceled before it matched */
    SLIME_ERR_UNSUPPORTED = -9,  /* transport or feature not available */
    SLIME_ERR_PROTOCOL = -10,    /* the peer sent bytes that break the protocol */
    SLIME_ERR_SYSTEM = -11,      /* a system call failed (detail has errno) */
    SLIME_ERR_CLOSED = -12,      /* endpoint or context was closed */
    SLIME_ERR_BUSY = -13,        /* resource still in use */
} slime_status_t;

/* Short fixed text for a status ("peer lost"). Never NULL. */
SLIME_API const char *slime_strerror(slime_status_t status);
/* Enum name of a status ("SLIME_ERR_PEER_LOST"). Never NULL. */
SLIME_API const char *slime_status_name(slime_status_t status);
/* Detail text of the last failing call made by this thread ("" if none).
 * Valid until the thread's next failing call. */
SLIME_API const char *slime_last_error(void);

/* ------------------------------------------------------------------ */
/* Context                                                             */
/* ------------------------------------------------------------------ */

typedef struct slime_ctx slime_ctx_t;
typedef struct slime_ep slime_ep_t;
typedef struct slime_mr slime_mr_t;
typedef struct slime_req slime_req_t;

typedef struct slime_ctx_opts {
    /* "auto", "shm", "tcp" or "verbs".  NULL: $DLSLIME_TRANSPORT, else
     * "auto" (shm to peers on the same host, verbs to peers where both
     * sides have a usable RDMA device, tcp to the rest).  Forcing a
     * transport applies to every endpoint this context dials or accepts.
     * "verbs" loads libibverbs at run time; where it is missing or no
     * device is usable, slime_ctx_create fails with SLIME_ERR_UNSUPPORTED
     * and a detail that says why.  Device choice: $DLSLIME_VERBS_DEVICES
     * (comma list of name[:port]; $LOCAL_RANK picks among several),
     * $DLSLIME_VERBS_GID_INDEX, $DLSLIME_VERBS_QPS (queue pairs per
     * endpoint; large one-sided ops are split across them). */
    const char *transport;
    /* IPv4 address the tcp listener binds and advertises.  NULL:
     * $DLSLIME_HOST, else bind 0.0.0.0 and advertise every up IPv4
     * interface address (loopback last). */
    const char *tcp_host;
    uint16_t tcp_port;           /* 0: an ephemeral port */
    /* Per-job secret.  Peers must present the same bytes at the
     * handshake.  NULL: $DLSLIME_TOKEN, else a random token of this
     * context's own, which its address blob carries: whoever holds the
     * blob may connect (the blob is the capability).  An empty token
     * (token_len 0) is refused: SLIME_ERR_INVAL. */
    const void *token;
    size_t token_len;
} slime_ctx_opts_t;

/* Fills opts with the defaults described above. */
SLIME_API void slime_ctx_opts_init(slime_ctx_opts_t *opts);

/* Creates a context and starts its listeners and progress thread.
 * opts may be NULL (defaults). */
SLIME_API slime_status_t slime_ctx_create(const slime_ctx_opts_t *opts,
                                          slime_ctx_t **out);

/* Gives messages whose sends completed up to the peer silence limit
 * (DLSLIME_PEER_SILENCE_MS, a second by default) to reach their live
 * peers (a transport may still hold them), then fails every pending
 * request with SLIME_ERR_CLOSED, closes every endpoint, stops the
 * progress thread and frees the context.  Threads
 * blocked in a wait on it return first (with the request's failure, or
 * SLIME_ERR_TIMEOUT for connect/accept); no call may start on the context
 * once destroy has begun.  MRs and requests the caller still holds stay
 * valid to deregister / free. */
SLIME_API void slime_ctx_destroy(slime_ctx_t *ctx);

/* Writes the context's address blob (how peers reach it) into buf.
 * *len: in, the capacity of buf; out, the blob's length.  With buf NULL
 * or too small, sets *len and returns SLIME_ERR_INVAL.  The blob of a
 * context made without a token is what lets a peer in (it carries the
 * digests of the context's own random token): give it only to peers;
 * other blobs hold no secret.  SLIME_ADDRESS_MAX bounds its size. */
#define SLIME_ADDRESS_MAX 512
SLIME_API slime_status_t slime_ctx_address(slime_ctx_t *ctx, void *buf,
                                           size_t *len);

/* A random 64-bit id, unique per context; part of the address. */
SLIME_API uint64_t slime_ctx_id(const slime_ctx_t *ctx);

/* What a context counts, for tests and tuning. */
typedef enum slime_counter {
    /* send/recv buffers outside user regions registered with the device
     * (verbs; 0 elsewhere) */
    SLIME_COUNTER_BUF_REGISTRATIONS = 0,
    /* ... and those that reused a registration kept from before */
    SLIME_COUNTER_BUF_REG_REUSED = 1,
    /* pings sent to peers that were waited on and silent (peer liveness:
     * DLSLIME_PEER_SILENCE_MS) */
    SLIME_COUNTER_PEER_PINGS = 2,
    /* tcp rendezvous this context received by copying them out of the
     * sender's memory (CMA), with a peer of this host in another network
     * namespace (DLSLIME_TCP_CMA) */
    SLIME_COUNTER_TCP_CMA_FETCHES = 3,
    /* eager messages that came before their receive and were copied into
     * a buffer of the context's, to be copied again when it is posted
     * (over shm one waits in the ring instead while nothing is behind it) */
    SLIME_COUNTER_UNEXPECTED_COPIES = 4,
    /* eager messages that came before their receive and were left where
     * they arrived (in the shm ring) until it is posted */
    SLIME_COUNTER_PARKED = 5,
    /* collectives of a two-rank communicator on one host that moved
     * their data through a box both processes map instead of messages
     * (small ones; DLSLIME_PAIR_BOX=0 turns it off) */
    SLIME_COUNTER_BOX_OPS = 6,
    /* wake-ups this context sent a peer on its host because no thread
     * of the peer's polled nor had lately (a syscall each: shm) */
    SLIME_COUNTER_DOORBELLS = 7,
    /* shm rendezvous this context received by copying them out of the
     * sender's memory (CMA) instead of through the rings: on a host with
     * more of our processes than cores (DLSLIME_SHM_FETCH) */
    SLIME_COUNTER_SHM_FETCHES = 8,
    /* sends this context posted by rendezvous (an announcement first,
     * the bytes once the receiver asks or fetches them) rather than
     * eagerly */
    SLIME_COUNTER_RENDEZVOUS = 9,
    /* pins on this context's regions that a peer of this host left when
     * its process ended in the middle of a copy (shm), taken off so that
     * deregistering those regions need not wait for them */
    SLIME_COUNTER_DEAD_PEER_PINS = 10,
} slime_counter_t;
/* The counter's value; 0 for an unknown counter. */
SLIME_API uint64_t slime_ctx_counter(const slime_ctx_t *ctx, slime_counter_t which);

/* ------------------------------------------------------------------ */
/* Endpoints                                                           */
/* ------------------------------------------------------------------ */

/* Returns the endpoint to the peer whose address blob is given, dialing
 * it if no endpoint to that peer exists yet.  Two contexts that connect
 * to each other at the same time end up sharing one connection; calling
 * it again returns the same endpoint.  Blocks up to timeout_ms for the
 * handshake.  Errors: SLIME_ERR_INVAL (malformed blob), SLIME_ERR_REFUSED
 * (the peer refused our version or token), SLIME_ERR_TIMEOUT,
 * SLIME_ERR_PEER_LOST (nobody there), SLIME_ERR_UNSUPPORTED (the forced
 * transport cannot reach that peer). */
SLIME_API slime_status_t slime_ep_connect(slime_ctx_t *ctx, const void *addr,
                                          size_t addr_len, int64_t timeout_ms,
                                          slime_ep_t **out);

/* Returns the next endpoint a peer dialed into this context, in arrival
 * order, waiting up to timeout_ms for one.  Each endpoint is returned once
 * (an endpoint that slime_ep_connect already handed out is still queued
 * here once: a server may accept what a client dialed). */
SLIME_API slime_status_t slime_ep_accept(slime_ctx_t *ctx, int64_t timeout_ms,
                                         slime_ep_t **out);

/* "shm", "tcp" or "verbs". */
SLIME_API const char *slime_ep_transport(const slime_ep_t *ep);
/* One line on how the endpoint is connected (for logs): the transport
 * and, for verbs, the device, port, GID and MTU on both sides.  Never
 * NULL; valid as long as the endpoint (see slime_ep_release). */
SLIME_API const char *slime_ep_describe(const slime_ep_t *ep);
/* The peer context's id. */
SLIME_API uint64_t slime_ep_peer_id(const slime_ep_t *ep);
/* SLIME_OK while connected, else the status that closed it
 * (SLIME_ERR_PEER_LOST, SLIME_ERR_CLOSED, SLIME_ERR_PROTOCOL). */
SLIME_API slime_status_t slime_ep_status(const slime_ep_t *ep);

/* Closes the connection, once messages whose sends completed are with
 * the peer (waiting the peer silence limit at most): pending requests on
 * it fail with SLIME_ERR_CLOSED.  The pointer stays valid until the
 * context is destroyed (or released: slime_ep_release); a later
 * slime_ep_connect to the same peer dials anew. */
SLIME_API void slime_ep_close(slime_ep_t *ep);

/* Holds on an endpoint.  Every endpoint slime_ep_connect or
 * slime_ep_accept returns comes with one hold for the caller, and
 * slime_ep_hold takes another (for instance on the endpoint of a
 * request, slime_req_ep, which is otherwise valid only as long as that
 * request).  slime_ep_release gives one back: the caller will not use
 * that pointer again.  An endpoint whose holds are all given back is
 * freed once its connection is down (closed by either side) and no
 * request or queued message of the context refers to it, so a context
 * that many peers come to and leave does not grow.  An endpoint that is
 * never released lives until the context is destroyed. */
SLIME_API void slime_ep_hold(slime_ep_t *ep);
SLIME_API void slime_ep_release(slime_ep_t *ep);

/* ------------------------------------------------------------------ */
/* Memory regions                                                      */
/* ------------------------------------------------------------------ */

#define SLIME_ACCESS_REMOTE_READ 0x1u
#define SLIME_ACCESS_REMOTE_WRITE 0x2u
#define SLIME_ACCESS_ALL (SLIME_ACCESS_REMOTE_READ | SLIME_ACCESS_REMOTE_WRITE)

/* Registers [addr, addr+len) for one-sided ops; len > 0.  access says
 * what peers may do with it (local use is always allowed). */
SLIME_API slime_status_t slime_mr_reg(slime_ctx_t *ctx, void *addr,
                                      size_t len, unsigned access,
                                      slime_mr_t **out);

/* Allocates len bytes (zeroed, page-aligned) of memory that shm peers
 * map and copy with plain loads and stores: one-sided ops on regions
 * registered inside it skip the cross-memory syscalls and run at memcpy
 * speed.  Register regions in it with slime_mr_reg as with any memory;
 * other transports treat it as ordinary memory.  The caller owns it:
 * slime_mem_free. */
SLIME_API slime_status_t slime_mem_alloc(size_t len, void **out);

/* Frees memory from slime_mem_alloc (NULL: nothing).  SLIME_ERR_BUSY
 * while regions registered inside it are still registered;
 * SLIME_ERR_INVAL for any other address. */
SLIME_API slime_status_t slime_mem_free(void *addr);

/* Watched memory: a promise that lets send/recv keep registrations.
 *
 * Transports that must register a buffer before the hardware may touch
 * it (verbs) register send/recv buffers outside user regions for each
 * large message.  Keeping those registrations is only safe while the
 * memory stays mapped: memory freed and mapped again at the same address
 * would still be registered with its old pages.  slime_mem_watch(addr,
 * len) is the caller's promise to call slime_mem_unwatch(addr) before
 * [addr, addr+len) is freed, unmapped or remapped; registrations inside
 * it are then kept (up to $DLSLIME_VERBS_REGCACHE_MB per device) and
 * dropped by the unwatch.  An allocator calls these (the torch backend
 * wraps torch's CPU allocator; the RPC payload pool watches its blocks).
 * Ranges must not overlap (SLIME_ERR_INVAL); len > 0. */
SLIME_API slime_status_t slime_mem_watch(void *addr, size_t len);
/* Ends the watch that starts at addr; SLIME_ERR_INVAL if none does. */
SLIME_API slime_status_t slime_mem_unwatch(void *addr);
/* Whether [addr, addr+len) lies inside one watched range. */
SLIME_API int slime_mem_watched(const void *addr, size_t len);

/* Deregisters and frees mr.  New remote accesses fail with
 * SLIME_ERR_ACCESS at once; accesses already copying finish first (the
 * call waits for them, at most a few seconds).  Local requests that still
 * use mr must have completed. */
SLIME_API slime_status_t slime_mr_dereg(slime_mr_t *mr);

SLIME_API void *slime_mr_addr(const slime_mr_t *mr);
SLIME_API size_t slime_mr_len(const slime_mr_t *mr);

/* The remote view of an MR: 64 plain bytes, valid in any process of the
 * same job until the MR is deregistered. */
typedef struct slime_mr_desc {
    uint8_t bytes[64];
} slime_mr_desc_t;

SLIME_API slime_status_t slime_mr_desc(const slime_mr_t *mr,
                                       slime_mr_desc_t *out);
/* Length of the region a descriptor names (0 if malformed). */
SLIME_API uint64_t slime_mr_desc_len(const slime_mr_desc_t *desc);

/* ------------------------------------------------------------------ */
/* Operations                                                          */
/* ------------------------------------------------------------------ */
/* Each posts the operation and hands back a request.  Argument errors are
 * returned at once (and *out is left NULL); errors found later (at the
 * peer, or the peer lost) complete the request with that status. */

/* Two-sided, tagged.  Messages between one pair with one tag are matched
 * in the order sent.  len may be 0.  A send completes when its buffer may
 * be reused. A receive completes with the message's length
 * (slime_req_bytes).  A message longer than cap fails the receive with
 * SLIME_ERR_TRUNCATED and is dropped; the send fails too when the message
 * was large enough to go by rendezvous (above the transport's eager limit,
 * by default 256 KiB on shm and tcp, 64 KiB on verbs: $DLSLIME_EAGER_SHM,
 * $DLSLIME_EAGER_TCP, $DLSLIME_EAGER_VERBS), and has already completed otherwise, as in MPI. */
SLIME_API slime_status_t slime_send(slime_ep_t *ep, const void *buf, size_t len,
                                    uint64_t tag, slime_req_t **out);
SLIME_API slime_status_t slime_recv(slime_ep_t *ep, void *buf, size_t cap,
                                    uint64_t tag, slime_req_t **out);
/* Receive from any endpoint of ctx; slime_req_ep tells which peer sent. */
SLIME_API slime_status_t slime_recv_any(slime_ctx_t *ctx, void *buf, size_t cap,
                                        uint64_t tag, slime_req_t **out);

/* One-sided: copy len bytes between local [local_off, +len) and the
 * peer's region named by remote at [remote_off, +len).  The peer's code
 * takes no part.  len must be > 0; both ranges must lie inside their
 * regions; remote must belong to the peer of ep and allow the access. */
SLIME_API slime_status_t slime_read(slime_ep_t *ep, slime_mr_t *local,
                                    size_t local_off,
                                    const slime_mr_desc_t *remote,
                                    size_t remote_off, size_t len,
                                    slime_req_t **out);
SLIME_API slime_status_t slime_write(slime_ep_t *ep, slime_mr_t *local,
                                     size_t local_off,
                                     const slime_mr_desc_t *remote,
                                     size_t remote_off, size_t len,
                                     slime_req_t **out);
/* A write that also delivers imm to the peer once the data is in place;
 * the peer collects it with slime_imm_recv. */
SLIME_API slime_status_t slime_write_imm(slime_ep_t *ep, slime_mr_t *local,
                                         size_t local_off,
                                         const slime_mr_desc_t *remote,
                                         size_t remote_off, size_t len,
                                         uint32_t imm, slime_req_t **out);
/* Completes with the next immediate value from ep's peer
 * (slime_req_imm), in arrival order, whether it arrived before or after
 * this call. */
SLIME_API slime_status_t slime_imm_recv(slime_ep_t *ep, slime_req_t **out);

/* Batches: many operations posted in one call, completed by one request
 * that finishes when all of them have (its status is the first failure,
 * or SLIME_OK). */
typedef enum slime_op_kind {
    SLIME_OP_SEND = 1,
    SLIME_OP_RECV = 2,
    SLIME_OP_READ = 3,
    SLIME_OP_WRITE = 4,
    SLIME_OP_WRITE_IMM = 5,
} slime_op_kind_t;

typedef struct slime_op {
    slime_op_kind_t kind;
    slime_ep_t *ep;
    /* SEND / RECV */
    void *buf;
    size_t len;                  /* also the length of READ / WRITE */
    uint64_t tag;
    /* READ / WRITE / WRITE_IMM */
    slime_mr_t *local;
    size_t local_off;
    const slime_mr_desc_t *remote;
    size_t remote_off;
    uint32_t imm;
} slime_op_t;

/* Validates every op first: if one is bad, nothing is posted and the
 * error names its index. */
SLIME_API slime_status_t slime_batch(slime_ctx_t *ctx, const slime_op_t *ops,
                                     size_t n, slime_req_t **out);

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

/* SLIME_INPROGRESS, or the final status.  Drives progress once. */
SLIME_API slime_status_t slime_req_test(slime_req_t *req);
/* Waits up to timeout_ms; returns the final status, or SLIME_ERR_TIMEOUT
 * with the request still pending (wait again, or cancel it). */
SLIME_API slime_status_t slime_req_wait(slime_req_t *req, int64_t timeout_ms);
/* Waits for all n; returns SLIME_OK, the first failure in array order, or
 * SLIME_ERR_TIMEOUT. */
SLIME_API slime_status_t slime_req_wait_all(slime_req_t *const *reqs, size_t n,
                                            int64_t timeout_ms);
/* Cancels a receive or imm_recv that has not matched yet (it completes
 * with SLIME_ERR_CANCELED).  Other requests: SLIME_ERR_BUSY. */
SLIME_API slime_status_t slime_req_cancel(slime_req_t *req);
/* Detail text of a failed request ("" while pending or on success). */
SLIME_API const char *slime_req_error(const slime_req_t *req);
/* Bytes a completed receive got. */
SLIME_API size_t slime_req_bytes(const slime_req_t *req);
/* Immediate value a completed imm_recv got. */
SLIME_API uint32_t slime_req_imm(const slime_req_t *req);
/* Endpoint a completed receive came from (useful after slime_recv_any). */
SLIME_API slime_ep_t *slime_req_ep(const slime_req_t *req);
/* Frees a request.  A pending one is canceled if it can be, else detached:
 * it is freed when it completes. */
SLIME_API void slime_req_free(slime_req_t *req);

/* Calls cb(req, arg) once req has completed: at once in the calling
 * thread if it already has, else later in the context's progress thread
 * (never under a library lock, so cb may call the library; it should be
 * short).  One callback per request; the request must not be freed
 * before the callback ran.  For futures (torch's Work.get_future). */
typedef void (*slime_req_cb_t)(slime_req_t *req, void *arg);
SLIME_API slime_status_t slime_req_on_complete(slime_req_t *req,
                                               slime_req_cb_t cb, void *arg);


/* ------------------------------------------------------------------ */
/* Communicators and collectives                                      */
/* ------------------------------------------------------------------ */
/* A communicator is a group of `size` contexts, one per rank, each
 * holding an endpoint to every other member.  Its messages travel in a
 * tag space of their own (the comm id in the top 16 bits of the tag, its
 * epoch in the next 8), so they never match user messages or another
 * communicator's.
 *
 * Collectives run in the order they are posted on a communicator: every
 * rank must post the same sequence, as in MPI.  They are executed by the
 * communicator's worker thread (the caller returns at once with a
 * request), or by a thread that waits on one not yet started, with no
 * hand-off (a collective nobody waits on starts at most 50 us after its
 * post); the request completes when this rank's part is done and its
 * buffers may be used.  A wait for about the communicator's timeout or
 * longer may so run the collective; if it then times out, the wait can
 * outlast its own timeout by up to a sixteenth of the communicator's
 * (at most a second).  A lost member fails the pending and later
 * collectives with SLIME_ERR_PEER_LOST; a collective that is not complete
 * within the communicator's timeout, counted from its first wait for a
 * peer, fails with SLIME_ERR_TIMEOUT.
 * Buffers must not overlap unless an operation says it works in place.
 *
 * A failed collective breaks the communicator, as in NCCL or Gloo: its
 * request fails with the cause and a detail naming the collective, the
 * step and the peer rank; the rank tells the other members, whose
 * pending collectives fail with the same status; every later collective
 * on it fails at once.  Create a new communicator to go on.  After a
 * failure, a send to a peer that is still alive may read its buffer for
 * up to half a second more (then it is abandoned).
 *
 * Arguments are checked before anything is posted: a bad one returns
 * SLIME_ERR_INVAL (SLIME_ERR_UNSUPPORTED for an op that does not apply
 * to the dtype) at once, *out stays NULL and the collective does not
 * count in the sequence.  Sizes must agree between ranks; a mismatch
 * seen by a receiver fails the collective with SLIME_ERR_INVAL (or
 * SLIME_ERR_TRUNCATED).
 *
 * Reductions follow torch: integers wrap, MIN/MAX propagate NaN, bool
 * SUM/MAX are logical or and PROD/MIN logical and, float16/bfloat16
 * combine in float and round to nearest even at each step.  Every rank
 * of an allreduce gets the very same bits.
 *
 * Tuning, from the environment; the first three must be the same on
 * every rank: $DLSLIME_COLL_SMALL (bytes up to which allreduce, reduce
 * and broadcast use latency-optimal trees, 64K), $DLSLIME_COLL_CHUNK
 * (pipeline chunk of the ring and chain algorithms, 512K),
 * $DLSLIME_COLL_CMA_MIN (ring buffers from which shm neighbours copy
 * chunks straight out of each other's memory; unset: none, the shm
 * stream moves them faster on the machines measured); DLSLIME_COLL_CMA=0
 * turns those one-sided copies off whatever the size. */

typedef struct slime_comm slime_comm_t;

typedef enum slime_dtype {
    SLIME_DT_INT8 = 0,
    SLIME_DT_UINT8 = 1,
    SLIME_DT_INT16 = 2,
    SLIME_DT_INT32 = 3,
    SLIME_DT_INT64 = 4,
    SLIME_DT_FLOAT16 = 5,
    SLIME_DT_BFLOAT16 = 6,
    SLIME_DT_FLOAT32 = 7,
    SLIME_DT_FLOAT64 = 8,
    SLIME_DT_BOOL = 9,
} slime_dtype_t;

typedef enum slime_redop {
    SLIME_RED_SUM = 0,
    SLIME_RED_PROD = 1,
    SLIME_RED_MIN = 2,
    SLIME_RED_MAX = 3,
    SLIME_RED_AVG = 4,   /* SUM then divide by size (floating types only) */
    SLIME_RED_BAND = 5,  /* bitwise ops: integer types and bool only */
    SLIME_RED_BOR = 6,
    SLIME_RED_BXOR = 7,
} slime_redop_t;

#define SLIME_ANY_SOURCE (-1)

/* Size in bytes of one element (0 for an unknown dtype). */
SLIME_API size_t slime_dtype_size(slime_dtype_t dtype);
/* SLIME_OK if op applies to dtype, else SLIME_ERR_UNSUPPORTED with a
 * detail naming both (e.g. BXOR on float32, AVG on int32). */
SLIME_API slime_status_t slime_redop_check(slime_redop_t op, slime_dtype_t dtype);

/* A receive that reduces instead of copying: buf holds count elements of
 * dtype, and each element i the message brings is folded in place,
 * buf[i] = buf[i] op incoming[i] (AVG folds as SUM; dividing is the
 * caller's), while the payload arrives: over shm straight out of the
 * shared ring, with no staging copy; elsewhere through a small buffer of
 * the core.  Matching, ordering and timeouts are those of slime_recv.
 * The message must be a whole number of elements (else the receive fails
 * with SLIME_ERR_INVAL, and so does a rendezvous send); more than count
 * elements fail it with SLIME_ERR_TRUNCATED.  slime_req_bytes gives the
 * bytes folded in; elements past them are untouched. */
SLIME_API slime_status_t slime_recv_reduce(slime_ep_t *ep, void *buf, size_t count,
                                           slime_dtype_t dtype, slime_redop_t op,
                                           uint64_t tag, slime_req_t **out);

/* Creates this rank's view of a communicator.  peers[r] is the endpoint
 * to rank r (peers[rank] is ignored and may be NULL); the array is copied.
 * comm_id (16 bits) must be the same on every rank and unique among the
 * communicators alive in the job.  epoch (8 bits, the same on every rank)
 * tells it apart from earlier communicators with the same id: their
 * messages, still in flight or queued unmatched, never match this one's.
 * Pick an epoch that differs from that of the last communicator with
 * this id on every member, and let every member have created the
 * communicator before any member posts on it.  Messages queued here
 * unmatched are dropped: those of other epochs of the id at create, the
 * communicator's own at destroy (the sender of a large one sees
 * SLIME_ERR_CANCELED).
 * timeout_ms bounds every collective. */
SLIME_API slime_status_t slime_comm_create(slime_ctx_t *ctx, uint32_t comm_id,
                                           uint32_t epoch, int rank, int size,
                                           slime_ep_t *const *peers,
                                           int64_t timeout_ms,
                                           slime_comm_t **out);
/* Fails what is still queued with SLIME_ERR_CLOSED (a collective that is
 * running gives up within moments, with SLIME_ERR_CLOSED too), stops the
 * worker and frees the communicator (its endpoints stay with the
 * context).  Destroy every communicator before its context. */
SLIME_API void slime_comm_destroy(slime_comm_t *comm);
SLIME_API int slime_comm_rank(const slime_comm_t *comm);
SLIME_API int slime_comm_size(const slime_comm_t *comm);
/* Applies to collectives that start after the call.  SLIME_ERR_INVAL
 * for a negative timeout (the old one stays). */
SLIME_API slime_status_t slime_comm_set_timeout(slime_comm_t *comm,
                                                int64_t timeout_ms);

/* Point-to-point in the communicator's tag space (tag: low 39 bits).
 * peer may be SLIME_ANY_SOURCE for a receive; slime_comm_req_source
 * tells which rank sent it.  These do not queue behind collectives. */
SLIME_API slime_status_t slime_comm_send(slime_comm_t *comm, int peer,
                                         const void *buf, size_t len,
                                         uint64_t tag, slime_req_t **out);
SLIME_API slime_status_t slime_comm_recv(slime_comm_t *comm, int peer,
                                         void *buf, size_t cap, uint64_t tag,
                                         slime_req_t **out);
/* Rank that sent a completed slime_comm_recv (-1 if unknown). */
SLIME_API int slime_comm_req_source(const slime_comm_t *comm,
                                    const slime_req_t *req);

/* Says that the calling thread waits on the next collective it posts on
 * comm right after posting it (a synchronous op), so that post does not
 * wake the communicator's worker thread: the wait runs the collective in
 * this thread, and a wake-up would only cost both a turn.  A wait that
 * cannot run it (another collective runs, or its timeout is shorter than
 * the communicator's) hands it to the worker then, and so do freeing its
 * request unwaited and slime_req_on_complete.  It applies to the next
 * collective call of this thread on comm, whether that posts or fails. */
SLIME_API void slime_comm_next_waited(slime_comm_t *comm);

/* In place: buf holds count elements on every rank; on completion each
 * rank holds the reduction over all ranks. */
SLIME_API slime_status_t slime_allreduce(slime_comm_t *comm, void *buf,
                                         size_t count, slime_dtype_t dtype,
                                         slime_redop_t op, slime_req_t **out);
/* In place: root's buf (bytes) is copied to every rank's buf. */
SLIME_API slime_status_t slime_broadcast(slime_comm_t *comm, void *buf,
                                         size_t bytes, int root,
                                         slime_req_t **out);
/* In place: root's buf ends up with the reduction; other ranks' buf may
 * be used as scratch (its content afterwards is unspecified). */
SLIME_API slime_status_t slime_reduce(slime_comm_t *comm, void *buf,
                                      size_t count, slime_dtype_t dtype,
                                      slime_redop_t op, int root,
                                      slime_req_t **out);
/* dst (size * bytes) gets every rank's src (bytes), in rank order.
 * src may be dst + rank * bytes (in place). */
SLIME_API slime_status_t slime_allgather(slime_comm_t *comm, const void *src,
                                         size_t bytes, void *dst,
                                         slime_req_t **out);
/* As slime_allgather, with a buffer of its own per block: block r (rank
 * r's src, bytes) lands in dst_blocks[r], which may lie anywhere (a list
 * of tensors, no flat staging).  The caller keeps owning src and every
 * block, which must stay valid and untouched until the request
 * completes; the array itself is copied.  src may be dst_blocks[rank]
 * (in place); blocks must not overlap each other.  SLIME_ERR_INVAL for
 * a NULL src, array or block while bytes > 0 (all are ignored when
 * bytes is 0), or size * bytes overflowing. */
SLIME_API slime_status_t slime_allgather_ptrs(slime_comm_t *comm,
                                              const void *src, size_t bytes,
                                              void *const *dst_blocks,
                                              slime_req_t **out);
/* Root's dst (size * bytes) gets every rank's src in rank order; dst is
 * ignored elsewhere. */
SLIME_API slime_status_t slime_gather(slime_comm_t *comm, const void *src,
                                      size_t bytes, void *dst, int root,
                                      slime_req_t **out);
/* Rank r's dst (bytes) gets block r of root's src (size * bytes). */
SLIME_API slime_status_t slime_scatter(slime_comm_t *comm, const void *src,
                                       size_t bytes, void *dst, int root,
                                       slime_req_t **out);
/* As slime_gather and slime_scatter, with a buffer of its own per block
 * at the root: block r of the root is dst_blocks[r] (src_blocks[r]),
 * which may lie anywhere (a list of tensors, no flat staging).  The
 * arrays are copied; the blocks must stay valid and untouched until the
 * request completes.  The root's src (dst) may be its own block (in
 * place).  The arrays are ignored on other ranks and when bytes is 0;
 * SLIME_ERR_INVAL for a NULL array or block at the root otherwise. */
SLIME_API slime_status_t slime_gather_ptrs(slime_comm_t *comm,
                                           const void *src, size_t bytes,
                                           void *const *dst_blocks, int root,
                                           slime_req_t **out);
SLIME_API slime_status_t slime_scatter_ptrs(slime_comm_t *comm,
                                            const void *const *src_blocks,
                                            size_t bytes, void *dst, int root,
                                            slime_req_t **out);
/* src holds size blocks of count elements; rank r's dst (count elements)
 * gets the reduction of block r over all ranks. */
SLIME_API slime_status_t slime_reduce_scatter(slime_comm_t *comm,
                                              const void *src, void *dst,
                                              size_t count,
                                              slime_dtype_t dtype,
                                              slime_redop_t op,
                                              slime_req_t **out);
/* As slime_reduce_scatter, with a buffer of its own per block:
 * src_blocks[b] holds this rank's block b (count elements) and may lie
 * anywhere (a list of tensors, no flat staging).  The blocks are only
 * read; the caller keeps owning them and dst, all valid until the
 * request completes; the array itself is copied.  dst must not overlap
 * any block (it holds partial sums while they are still read).
 * SLIME_ERR_INVAL for a NULL dst, array or block while count > 0 (all
 * are ignored when count is 0) or size * count elements overflowing;
 * SLIME_ERR_UNSUPPORTED as for slime_reduce_scatter. */
SLIME_API slime_status_t slime_reduce_scatter_ptrs(
    slime_comm_t *comm, const void *const *src_blocks, void *dst,
    size_t count, slime_dtype_t dtype, slime_redop_t op, slime_req_t **out);
/* Rank r sends send_bytes[p] bytes at src + send_offs[p] to every rank p
 * and receives recv_bytes[p] bytes from p at dst + recv_offs[p].  The four
 * arrays (size entries each) are copied. */
SLIME_API slime_status_t slime_alltoallv(slime_comm_t *comm, const void *src,
                                         const size_t *send_bytes,
                                         const size_t *send_offs, void *dst,
                                         const size_t *recv_bytes,
                                         const size_t *recv_offs,
                                         slime_req_t **out);
/* As slime_alltoallv, with a buffer of its own per peer: sends
 * send_bytes[p] bytes at srcs[p] to rank p and receives recv_bytes[p]
 * bytes from p into dsts[p] (NULL allowed where the count is 0; this
 * rank's own block may be in place, srcs[rank] == dsts[rank]).  The
 * arrays are copied. */
SLIME_API slime_status_t slime_alltoallv_ptrs(slime_comm_t *comm,
                                              const void *const *srcs,
                                              const size_t *send_bytes,
                                              void *const *dsts,
                                              const size_t *recv_bytes,
                                              slime_req_t **out);
/* Completes when every rank has posted it. */
SLIME_API slime_status_t slime_barrier(slime_comm_t *comm, slime_req_t **out);

#ifdef __cplusplus
}
#endif

/* SlimeRPC: remote calls over the same endpoints. */
#include "rpc.h"

#endif /* DLSLIME_H */
