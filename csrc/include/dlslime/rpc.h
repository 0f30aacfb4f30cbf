/*
 * rpc.h - SlimeRPC, remote calls over libdlslime endpoints (included by
 * dlslime.h; part of the same library).
 *
 * A server serves one service on a context, under a 16-bit port (the
 * caller picks it; the Python layer hashes the service's name).  A client
 * is a channel from one context to one server over an endpoint.  Calls
 * carry a 64-bit method id and an opaque payload; replies carry a
 * payload, or an error payload (a remote failure).
 *
 * Datapath
 *   Requests land in the server's mailbox: receive slots of slot_size
 *   bytes it keeps posted.  A client may have `credits` requests in
 *   flight (granted by the server at connect time); one more waits in the
 *   client until a reply returns a credit.  Replies land in the client's
 *   own slots the same way.  A payload that does not fit a slot is
 *   announced in the slot and moves as one bulk send/recv on the same
 *   endpoint (no size cap; shm moves it with a single copy).
 *
 * Checks
 *   slime_rpc_client_create exchanges a hello: the wire version and a
 *   digest of the whole service definition must match, else it fails
 *   with SLIME_ERR_REFUSED and a detail saying which.  The server checks
 *   every call's method id against its table: an unknown id is answered
 *   with an error reply, never handed out.
 *
 * Tags
 *   RPC traffic uses the tags whose top 16 bits are all ones
 *   (SLIME_RPC_TAG_SPACE): user messages must not use them, and no
 *   communicator may have id 0xffff (slime_comm_create refuses it).
 *
 * Lifetimes
 *   Destroy servers and clients before their context.  A call handed
 *   out by slime_rpc_server_next belongs to the caller until it is
 *   finished (reply, reply_commit or fail; exactly once), which frees it;
 *   the server's memory lives on until its last call is finished.  A
 *   client request belongs to the caller until slime_rpc_req_free.
 */
#ifndef DLSLIME_RPC_H
#define DLSLIME_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tags in [SLIME_RPC_TAG_SPACE, 2^64) belong to RPC. */
#define SLIME_RPC_TAG_SPACE (0xffffull << 48)
/* Version of the RPC header; a peer with another one is refused. */
#define SLIME_RPC_VERSION 3
/* Smallest slot: room for a header and short error texts. */
#define SLIME_RPC_SLOT_MIN 1024
/* Most requests one client may have in flight. */
#define SLIME_RPC_CREDITS_MAX 1024

typedef struct slime_rpc_server slime_rpc_server_t;
typedef struct slime_rpc_call slime_rpc_call_t;
typedef struct slime_rpc_client slime_rpc_client_t;
typedef struct slime_rpc_req slime_rpc_req_t;

typedef struct slime_rpc_opts {
    /* Bytes of one receive slot, header included (>= SLIME_RPC_SLOT_MIN).
     * Payloads that do not fit go by a bulk transfer. */
    size_t slot_size;
    /* Server: most credits granted to one client; client: credits asked
     * for (1..SLIME_RPC_CREDITS_MAX). */
    uint32_t credits;
    /* Server: most receive slots kept posted (the pool grows with the
     * credits granted, up to this; beyond it requests still arrive, by
     * the core's bounded unexpected-message path). */
    uint32_t max_slots;
    /* (Server, from the environment: DLSLIME_RPC_BULK_BUDGET, 4 GiB by
     * default, bounds the bulk payload bytes one client has announced
     * and not yet sent; see server.c.) */
} slime_rpc_opts_t;

/* Defaults: 64 KiB slots, 16 credits, 1024 slots at most. */
SLIME_API void slime_rpc_opts_init(slime_rpc_opts_t *opts);

/* ---- server --------------------------------------------------------- */

/* Serves port on ctx.  digest names the service definition (clients must
 * present the same one); method_ids (n, copied) are the ids it accepts.
 * opts may be NULL.  The endpoints clients call from are the server's to
 * keep: one stays while its client has calls, and once the client is gone
 * the server lets it go, taking it out of the context's accept queue if
 * it is still there, so that a server many clients come to and leave does
 * not grow.  Errors: SLIME_ERR_INVAL, SLIME_ERR_BUSY (a server of this
 * context already has the port), SLIME_ERR_NOMEM. */
SLIME_API slime_status_t slime_rpc_server_create(slime_ctx_t *ctx, uint16_t port,
                                                 uint64_t digest,
                                                 const uint64_t *method_ids, size_t n,
                                                 const slime_rpc_opts_t *opts,
                                                 slime_rpc_server_t **out);

/* Waits up to timeout_ms for the next request and hands it out (calls
 * come out in arrival order; several threads may wait at once).  Hellos
 * and calls of unknown methods are answered inside.  Errors:
 * SLIME_ERR_TIMEOUT, SLIME_ERR_CLOSED (the server is being destroyed or
 * its context closed). */
SLIME_API slime_status_t slime_rpc_server_next(slime_rpc_server_t *srv, int64_t timeout_ms,
                                               slime_rpc_call_t **out);

/* Stops serving: threads in slime_rpc_server_next, and later calls of
 * it, return SLIME_ERR_CLOSED; the slots are canceled.  Calls already
 * handed out stay valid until finished.  Idempotent. */
SLIME_API void slime_rpc_server_shutdown(slime_rpc_server_t *srv);
/* Shuts down (if not yet), waits for the threads still inside
 * slime_rpc_server_next to leave, and frees the server once its last
 * call is finished.  No call on srv may start after this one (stop your
 * serving threads after shutdown, then destroy). */
SLIME_API void slime_rpc_server_destroy(slime_rpc_server_t *srv);

SLIME_API uint64_t slime_rpc_call_method(const slime_rpc_call_t *call);
/* The request payload (valid until the call is finished, or, after
 * slime_rpc_call_detach, until the caller frees the memory). */
SLIME_API const void *slime_rpc_call_data(const slime_rpc_call_t *call, size_t *len);
/* The endpoint the call came from (valid until the call is finished;
 * slime_ep_hold keeps it longer). */
SLIME_API slime_ep_t *slime_rpc_call_ep(const slime_rpc_call_t *call);
/* Gives the memory holding the payload to the caller (*mem, release it
 * with slime_rpc_mem_free when done), so the payload outlives the call; the server takes a new
 * slot buffer.  slime_rpc_call_data keeps pointing into *mem. */
SLIME_API slime_status_t slime_rpc_call_detach(slime_rpc_call_t *call, void **mem);

/* Each of the three finishing calls sends the answer, waits up to
 * timeout_ms for it to leave, and frees the call, whatever the outcome.
 * SLIME_ERR_TIMEOUT: the answer is still queued and buf may still be read
 * until the context is destroyed (keep it alive); SLIME_ERR_PEER_LOST and
 * others: the client is gone (nothing to do). */
SLIME_API slime_status_t slime_rpc_call_reply(slime_rpc_call_t *call, const void *buf,
                                              size_t len, int64_t timeout_ms);
/* A buffer of cap bytes to build the reply in place (owned by the call;
 * one per call), then slime_rpc_call_reply_commit sends its first len
 * bytes (len <= cap). */
SLIME_API slime_status_t slime_rpc_call_reply_buffer(slime_rpc_call_t *call, size_t cap,
                                                     void **buf);
SLIME_API slime_status_t slime_rpc_call_reply_commit(slime_rpc_call_t *call, size_t len,
                                                     int64_t timeout_ms);
/* slime_rpc_call_reply of the concatenation buf[0..len) tail[0..tail_len),
 * the tail sent from its memory when the reply goes by bulk. */
SLIME_API slime_status_t slime_rpc_call_reply_parts(slime_rpc_call_t *call, const void *buf, size_t len,
                                                    const void *tail, size_t tail_len, int64_t timeout_ms);
/* Answers with an error: the client's request completes with
 * slime_rpc_req_remote_error() true and this payload as its data. */
SLIME_API slime_status_t slime_rpc_call_fail(slime_rpc_call_t *call, const void *buf,
                                             size_t len, int64_t timeout_ms);

/* Frees the call without answering (the client's request then runs into
 * its timeout).  Touches no endpoint: the one way to let go of a call
 * after its context was destroyed. */
SLIME_API void slime_rpc_call_drop(slime_rpc_call_t *call);

/* ---- client --------------------------------------------------------- */

/* Opens a channel to the server at port behind ep and does the hello
 * (waits up to timeout_ms).  Errors: SLIME_ERR_REFUSED (other version, or
 * the server's service definition differs from digest), SLIME_ERR_TIMEOUT
 * (no answer: no server at that port?), SLIME_ERR_PEER_LOST,
 * SLIME_ERR_BUSY (too many clients in this process), SLIME_ERR_INVAL. */
SLIME_API slime_status_t slime_rpc_client_create(slime_ctx_t *ctx, slime_ep_t *ep,
                                                 uint16_t port, uint64_t digest,
                                                 const slime_rpc_opts_t *opts,
                                                 int64_t timeout_ms,
                                                 slime_rpc_client_t **out);
/* Fails the client's pending requests with SLIME_ERR_CLOSED and frees
 * the channel.  Requests the caller holds stay valid to free. */
SLIME_API void slime_rpc_client_destroy(slime_rpc_client_t *cli);
/* Credits the server granted. */
SLIME_API uint32_t slime_rpc_client_credits(const slime_rpc_client_t *cli);

/* What lending (SLIME_RPC_CALL_LEND) did for one client. */
typedef struct slime_rpc_lend_stats {
    uint64_t lent;      /* requests whose payload was lent */
    uint64_t in_place;  /* replies read in place from their request's block */
    uint64_t kept;      /* blocks the server kept (a handler held a view past its reply) */
    uint64_t blocks;    /* blocks made */
} slime_rpc_lend_stats_t;
/* Fills *out; returns whether this client's channel lends at all (the
 * server is on this host and could map the hello's probe block). */
SLIME_API bool slime_rpc_client_lend_stats(slime_rpc_client_t *cli, slime_rpc_lend_stats_t *out);

/* Starts a call.  buf must stay valid until the request completes (or,
 * if freed before, see slime_rpc_req_free).  Never blocks: without a
 * credit the call waits in the client.  Errors: SLIME_ERR_INVAL, and the
 * failure that broke the client (SLIME_ERR_PEER_LOST when the server is
 * gone, SLIME_ERR_CLOSED). */
SLIME_API slime_status_t slime_rpc_call(slime_rpc_client_t *cli, uint64_t method_id,
                                        const void *buf, size_t len,
                                        slime_rpc_req_t **out);
/* A call's payload and where its reply goes (slime_rpc_call_args). */
typedef struct slime_rpc_call_args {
    size_t size;            /* sizeof(slime_rpc_call_args_t): the struct may grow */
    const void *buf;        /* the payload is buf[0..len) followed by tail[0..tail_len) */
    size_t len;
    const void *tail;       /* sent from this memory, not copied, when the payload is too */
    size_t tail_len;        /* large for a slot: a message's large tensor, say */
    void *reply_buf;        /* NULL, or where the reply lands (no memory allocated for it); */
    size_t reply_cap;       /* a longer reply, or an error, lands in the request's own memory */
    uint32_t flags;         /* SLIME_RPC_CALL_* */
} slime_rpc_call_args_t;

/* A large payload may be lent to a server on this host: copied once into
 * shared memory the server reads in place, and a reply whose bytes (or
 * whose tail part) are a range of the request's own payload (an echo, a
 * slice) is read in place too.  A server that keeps a view of the payload
 * past its reply keeps the block; the client lends another next time. */
#define SLIME_RPC_CALL_LEND 0x1u

/* slime_rpc_call with a payload in two parts and, optionally, the
 * caller's memory for the reply.  buf, tail and reply_buf must stay valid
 * until the request completes; a request freed while pending may still
 * write reply_buf until the context is destroyed (see slime_rpc_req_free). */
SLIME_API slime_status_t slime_rpc_call_args(slime_rpc_client_t *cli, uint64_t method_id,
                                             const slime_rpc_call_args_t *args,
                                             slime_rpc_req_t **out);
/* Whether the completed request's reply landed in its reply_buf (false
 * without one, for an error, or for a reply longer than reply_cap:
 * slime_rpc_req_data then points into the request's own memory). */
SLIME_API bool slime_rpc_req_in_reply_buf(const slime_rpc_req_t *req);
/* SLIME_INPROGRESS or the final status (drives the channel once). */
SLIME_API slime_status_t slime_rpc_req_test(slime_rpc_req_t *req);
/* Waits up to timeout_ms: SLIME_OK (a reply or a remote error came),
 * SLIME_ERR_TIMEOUT (still pending: wait again or free it),
 * SLIME_ERR_PEER_LOST (the server is gone), SLIME_ERR_CLOSED. */
SLIME_API slime_status_t slime_rpc_req_wait(slime_rpc_req_t *req, int64_t timeout_ms);
/* Whether the completed request's reply is an error. */
SLIME_API bool slime_rpc_req_remote_error(const slime_rpc_req_t *req);
/* The reply payload of a completed request (NULL with *len 0 if none). */
SLIME_API const void *slime_rpc_req_data(const slime_rpc_req_t *req, size_t *len);
/* Gives the reply's memory to the caller (slime_rpc_mem_free it), as
 * slime_rpc_call_detach. */
SLIME_API slime_status_t slime_rpc_req_detach(slime_rpc_req_t *req, void **mem);

/* Releases memory from slime_rpc_call_detach or slime_rpc_req_detach
 * (NULL: nothing).  Large payload buffers go back to a pool for the next
 * calls (DLSLIME_RPC_POOL_MB of idle ones at most, 256 by default). */
SLIME_API void slime_rpc_mem_free(void *mem);
/* Detail of a failed request ("" otherwise). */
SLIME_API const char *slime_rpc_req_error(const slime_rpc_req_t *req);
/* Whether the request's payload has been sent in full (buf no longer
 * read). */
SLIME_API bool slime_rpc_req_sent(const slime_rpc_req_t *req);
/* Frees a request.  A pending one is abandoned: its late reply is
 * dropped when it comes; if it was not yet sent in full
 * (slime_rpc_req_sent), buf may still be read until the context is
 * destroyed. */
SLIME_API void slime_rpc_req_free(slime_rpc_req_t *req);

#ifdef __cplusplus
}
#endif

#endif /* DLSLIME_RPC_H */
