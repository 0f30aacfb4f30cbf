/* A transport moves the bytes of the frame protocol between two
 * contexts, in the style of a verbs provider's ops table: the core owns
 * framing, matching and requests; a transport only dials, accepts and
 * moves bytes (plus, optionally, one-sided copies it can do itself), and
 * answers the questions the core would otherwise answer by its name:
 * whether it serves this context, whether it reaches a peer and how well,
 * its eager limit, how it listens, what it needs from the progress loop.
 * The provider table (providers.c) lists every transport; a context
 * opens those that serve it (core/transports.c). */
#ifndef SLIME_TRANSPORT_H
#define SLIME_TRANSPORT_H

#include <sys/types.h>
#include <sys/uio.h>

#include "core/internal.h"

/* Wire ids: what a hello names, and a context's slot (< TRANSPORT_MAX).
 * Fixed for a wire version: peers must agree on them. */
enum { WIRE_TRANSPORT_TCP = 1, WIRE_TRANSPORT_SHM = 2, WIRE_TRANSPORT_VERBS = 3 };

/* The bits of wire_addr_t.flags, one per transport that is open in the
 * address's context.  tcp owns port, n_hosts and hosts; verbs dials
 * through the tcp listener, so it reads them too. */
#define ADDR_HAS_SHM 0x1u
#define ADDR_HAS_TCP 0x2u
#define ADDR_HAS_VERBS 0x4u

/* How well a transport reaches a peer (reach): the core dials by the
 * best, the provider table's order breaking ties. */
enum { TP_REACH_NONE = 0, TP_REACH_NETWORK = 1, TP_REACH_FABRIC = 2, TP_REACH_HOST = 3 };

/* What ctx_open is asked for. */
enum tp_mode {
    TP_AUTO,            /* the context picks per peer */
    TP_FORCED,          /* every endpoint uses this one */
    TP_OTHER_FORCED,    /* every endpoint uses another one */
};

typedef struct transport_ops {
    /* sizeof(transport_ops_t) where the table was built: a context reads
     * the fields past it as NULL / 0, so the table can grow */
    size_t size;
    const char *name;
    int wire;                               /* WIRE_TRANSPORT_* */
    unsigned caps;                          /* TP_CAP_* (core/internal.h) */
    /* Sends up to this many bytes go as one frame, larger ones by
     * rendezvous: $eager_env, else eager_default. */
    const char *eager_env;
    size_t eager_default;
    /* The words for a context it cannot serve, after a peer's id or its
     * own name ("has no usable RDMA device"). */
    const char *absent;
    /* Its dialer connects to the listener of this transport (a wire id),
     * whose read_hello reads the hello, then hands the connection to it;
     * 0: its own listener. */
    int via;

    /* ---- per context ---- */
    /* Sets *state to what the transport keeps for ctx, or to NULL when it
     * does not serve ctx (auto mode without a device; another transport
     * forced), which is no error.  ctx->addr has its identity already. */
    slime_status_t (*ctx_open)(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, enum tp_mode mode,
                               void **state);
    /* Frees state: every endpoint is closed and every MR unregistered. */
    void (*ctx_close)(void *state);
    /* Sets its flag in a (ADDR_HAS_*) and the fields it owns. */
    void (*address)(const void *state, wire_addr_t *a);
    /* How it reaches the peer at *peer: TP_REACH_*. */
    int (*reach)(const slime_ctx_t *ctx, const void *state, const wire_addr_t *peer);
    /* Optional: an fd the core watches for incoming connections, and
     * what to do when it is readable (hand each to pending_conn_add):
     * false when connections still wait but fds or memory ran out, and
     * the core should stop listening a while. */
    int (*listen_fd)(const void *state);
    bool (*accept)(slime_ctx_t *ctx, void *state);
    /* Optional: its share of a slime_ctx_counter. */
    uint64_t (*counter)(const void *state, slime_counter_t which);

    /* ---- per connection ---- */
    /* Dials the peer and runs the dialer's half of the handshake, blocking
     * until deadline.  Called without ctx->lock. */
    slime_status_t (*dial)(slime_ctx_t *ctx, const wire_addr_t *peer,
                           uint64_t deadline_ns, void **conn, int *fd,
                           wire_welcome_t *w);
    /* Reads what it can of a pending connection's hello (non-blocking):
     * 1 when complete, 0 when more is needed, -1 when the peer is bad. */
    int (*read_hello)(slime_ctx_t *ctx, pending_conn_t *pc);
    /* Sends the welcome; with ep set (accepted), also builds the
     * connection from what came with the hello. */
    slime_status_t (*send_welcome)(slime_ctx_t *ctx, pending_conn_t *pc,
                                   const wire_welcome_t *w, void **conn);
    /* Non-blocking byte stream: bytes moved, 0 if none now, or a negative
     * slime_status_t when the connection broke (ep_fail already done).
     * read's n is all that dst still waits for (the frames ask for a
     * whole payload at once), so a transport may copy differently into
     * a large destination (shm streams past the cache). */
    ssize_t (*read)(slime_ep_t *ep, void *dst, size_t n);
    ssize_t (*writev)(slime_ep_t *ep, const struct iovec *iov, int n);
    /* True when bytes wait to be read without asking the kernel (rings). */
    bool (*rx_ready)(slime_ep_t *ep);
    /* The ep's fd reported events (doorbells, hang-ups). */
    void (*fd_event)(slime_ep_t *ep, uint32_t events);
    /* One-sided copy done by the initiator alone; NULL if unsupported.
     * Moves at most max bytes of req; SLIME_INPROGRESS while bytes remain,
     * SLIME_ERR_UNSUPPORTED to leave req to frames, from its first byte
     * (the kernel refuses, or frames are the faster way for it). */
    slime_status_t (*rma)(slime_ep_t *ep, slime_req_t *req, size_t max);
    /* Releases the connection (fd included). */
    void (*close)(slime_ep_t *ep);

    /* Optional, NULL (false) where the transport has no use for them. */
    /* Work waits that no fd event will announce (a cheap look, for the
     * progress thread's decision to sleep). */
    bool (*has_work)(slime_ep_t *ep);
    /* A request waits on the peer's progress engine in a way the core
     * does not see (for liveness: ping the peer, fail it when silent). */
    bool (*waits_on_peer)(slime_ep_t *ep);
    /* True when more than n bytes wait, or the peer hung up: an eager
     * payload of n bytes may then stay where it is (rx.parked) until its
     * receive is posted, for as long as nothing waits behind it. */
    bool (*rx_beyond)(slime_ep_t *ep, size_t n);
    /* Bytes writev took (their sends completed) that may not be with the
     * peer yet, and that close would drop: a socket's close still
     * delivers them, a queue pair's does not.  Close waits a moment for
     * them (ep_linger). */
    bool (*tx_unsent)(slime_ep_t *ep);
    /* rma takes every request whole at once and completes it itself. */
    bool rma_async;
    /* The peer process's pid as the kernel vouched for it (a unix
     * socket's SO_PEERCRED), or 0 where nothing did: what may be handed
     * to pidfd_open to reach the very process on the other end. */
    int (*verified_pid)(const void *conn);
    /* The fd the core watches for an accepted conn, when it is not the
     * socket the hello came on (the conn owns that socket then). */
    int (*conn_fd)(void *conn);
    /* Rendezvous the receiver may fetch by itself: fills the RTS
     * (FF_RDMA, d, rkey) or leaves it a plain one. */
    void (*rndv_offer)(slime_ep_t *ep, slime_req_t *send, frame_t *rts);
    /* Fetches an FF_RDMA rendezvous into recv: SLIME_OK when under way
     * (the transport completes recv, then calls proto_rndv_done), else
     * the caller answers with a plain CTS. */
    slime_status_t (*rndv_fetch)(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq,
                                 uint64_t raddr, uint32_t rkey, uint64_t len);
    /* The peer answered an offered rendezvous (fetched it, or sent a CTS):
     * the send's buffer is no longer exposed. */
    void (*rndv_release)(slime_ep_t *ep, slime_req_t *send);
    /* The next received bytes where they lie (at most n, contiguous),
     * for a receive that reads them in place instead of copying them
     * out (a combining one); 0 if none now.  rx_consume(k) gives the
     * first k of them back to the writer. */
    size_t (*rx_peek)(slime_ep_t *ep, size_t n, const uint8_t **at);
    void (*rx_consume)(slime_ep_t *ep, size_t k);
    /* One line on the connection, for slime_ep_describe. */
    void (*describe)(void *conn, char *buf, size_t len);
    /* Whether the peer runs on this host (its process competes with ours
     * for the host's cores); NULL: never. */
    bool (*peer_local)(const void *conn);
    /* Shared boxes (core/box.c, p2p_box_t): how many slots a connection
     * has (at most 32; 0: none), and one slot's two sides, filled into
     * box (mine, theirs, len, hold).  hold keeps the memory mapped until
     * box_release, even once the connection is closed: a thread may
     * still poll the box when the peer dies. */
    int (*box_slots)(slime_ep_t *ep);
    bool (*box_open)(slime_ep_t *ep, int slot, p2p_box_t *box);
    void (*box_release)(void *hold);
} transport_ops_t;

/* providers.c: every transport, best first; NULL-terminated. */
extern const transport_ops_t *const slime_transports[];

#endif
