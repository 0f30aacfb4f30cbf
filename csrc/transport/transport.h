/* A transport moves the bytes of the stream protocol between two
 * contexts, in the style of a verbs provider's ops table: the core owns
 * framing, matching and requests; a transport only dials, accepts and
 * moves bytes (plus, optionally, one-sided copies it can do itself). */
#ifndef SLIME_TRANSPORT_H
#define SLIME_TRANSPORT_H

#include <sys/types.h>
#include <sys/uio.h>

#include "core/internal.h"

typedef struct transport_ops {
    const char *name;
    int wire;                               /* WIRE_TRANSPORT_* */
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
     * read's n is all that dst still waits for (the stream asks for a
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
    /* rma takes every request whole at once and completes it itself. */
    bool rma_async;
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
} transport_ops_t;

extern const transport_ops_t slime_tcp_transport;
extern const transport_ops_t slime_shm_transport;
extern const transport_ops_t slime_verbs_transport;

/* Listeners, set up by the context. */
slime_status_t tcp_listen(slime_ctx_t *ctx, const char *host, uint16_t port,
                          int *fd, uint16_t *bound_port);
slime_status_t shm_listen(slime_ctx_t *ctx, int *fd);
/* Accepts what the listener has and hands each fd to pending_conn_add. */
void listener_accept(slime_ctx_t *ctx, int lfd, int transport);
/* The shm ring of ep has readable bytes (cheap, for sleep decisions). */
bool shm_has_work(slime_ep_t *ep);

#endif
