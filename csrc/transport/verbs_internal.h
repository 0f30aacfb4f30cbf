/* The verbs transport's private objects.
 *
 * A context opens one RDMA device (verbs_dev_t).  An endpoint is one
 * verbs_conn_t: a few RC queue pairs to the peer sharing one completion
 * queue, whose completion channel sits (with the tcp socket the handshake
 * came on, kept as the liveness line) in a small epoll set that is the
 * endpoint's fd in the context's epoll, so the progress thread sleeps
 * when idle and wakes on completions or a hang-up.
 *
 * QP 0 carries the core's frame stream as SEND/RECV messages through
 * registered bounce slots, with credits so that a receive is always
 * posted for what arrives (no RNR).  One-sided ops are native RDMA
 * READ/WRITE(/WITH_IMM), split in chunks over all QPs.  Every call into
 * libibverbs that is not inline goes through verbs_api (dlopen), so the
 * library works where rdma-core is absent.  All of it runs under
 * ctx->lock unless a function says otherwise. */
#ifndef SLIME_VERBS_INTERNAL_H
#define SLIME_VERBS_INTERNAL_H

#include <infiniband/verbs.h>

#include "core/regcache.h"
#include "transport/transport.h"
#include "transport/verbs.h"

#define VERBS_MAX_QPS 16
#define VERBS_MAX_DEVNAME 32

/* ---- libibverbs, loaded at run time (verbs_api.c) ---- */
typedef struct verbs_api {
    struct ibv_device **(*get_device_list)(int *n);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *c);
    int (*query_device)(struct ibv_context *c, struct ibv_device_attr *a);
    int (*query_port)(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a);
    int (*query_gid)(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *c);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *c);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *c, int cqe, void *cq_ctx, struct ibv_comp_channel *ch,
                                int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned n);
    const char *(*wc_status_str)(enum ibv_wc_status st);
    int (*get_async_event)(struct ibv_context *c, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);
    const char *(*event_type_str)(enum ibv_event_type t);
} verbs_api_t;

extern verbs_api_t verbs_api;
/* Loads libibverbs once per process; false with why filled if it cannot. */
bool verbs_api_load(char *why, size_t whylen);
/* ibv_query_port without the header's inline wrapper (which would link
 * the library). */
int verbs_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);

/* ---- the device a context uses (verbs_dev.c) ---- */
struct verbs_dev;
/* The verbs transport's state in ctx: its device, or NULL where the
 * transport is not open. */
static inline struct verbs_dev *verbs_dev_of(const slime_ctx_t *ctx) {
    return ctx_tp_state(ctx, WIRE_TRANSPORT_VERBS);
}
typedef struct verbs_conn verbs_conn_t;

typedef struct verbs_dev {
    struct ibv_context *ibv;
    struct ibv_pd *pd;
    char name[VERBS_MAX_DEVNAME];
    uint8_t port;
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    bool ethernet;              /* RoCE: every packet needs a GRH */
    enum ibv_mtu mtu;
    uint32_t max_msg;           /* largest message the port takes */
    int rd_atom;                /* RDMA READs in flight per QP */
    int n_qps;
    uint32_t slot_size, recv_slots, send_slots;
    uint32_t chunk;             /* one-sided ops are split in pieces of this */
    uint32_t sq_depth;          /* RDMA work requests in flight per QP */
    size_t rndv_min;            /* smaller messages outside user regions go by the stream */
    uint8_t timeout, retry_cnt; /* RC ack timeout (4.096 us * 2^t), retries */
    uint64_t stall_ns;          /* verbs_watchdog.c; 0: never */
    char desc[160];
    bool forced;                /* DLSLIME_TRANSPORT=verbs: failures are errors */
    /* the verbs rkey of each MR table slot, for the peers that ask:
     * VKEY_VALID | rkey, or 0 (a region left unregistered in auto mode) */
    uint64_t slot_vkey[MR_TABLE_SLOTS];
    md_t *md;                   /* the verbs memory domain open on it (verbs_md.c) */
    /* recent asynchronous events about QPs (a QP the device broke by
     * itself flushes its work without an error completion) */
    struct {
        uint32_t qp_num;
        enum ibv_event_type type;
    } qp_events[32];
    unsigned n_qp_events;
} verbs_dev_t;

/* Opens the RDMA device a context will use.  Without a usable one:
 * forced, fails with SLIME_ERR_UNSUPPORTED and a detail that says why;
 * else returns SLIME_OK with *out NULL. */
slime_status_t verbs_dev_open(bool forced, verbs_dev_t **out);
/* After every endpoint is closed and every MR unregistered. */
void verbs_dev_close(verbs_dev_t *d);

/* Reads the device's pending asynchronous events; the text of the last
 * one about a QP of c, or NULL. */
const char *verbs_async_why(verbs_conn_t *c);

#define VKEY_VALID (1ull << 32)

/* ---- how an endpoint comes up (verbs_handshake.c) ---- */
slime_status_t verbs_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline, void **conn, int *fd_out,
                          wire_welcome_t *w);
int verbs_read_hello(slime_ctx_t *ctx, pending_conn_t *pc);
slime_status_t verbs_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc, const wire_welcome_t *w, void **conn);
int verbs_conn_fd(void *conn);
bool verbs_peer_local(const void *conn);
void verbs_describe(void *conn, char *buf, size_t len);

/* What the handshake carries. */
#define VERBS_INFO_MAGIC 0x53425256u /* "VRBS" */
typedef struct wire_verbs_info {
    uint32_t magic;
    uint16_t n_qps;
    uint8_t mtu;                /* enum ibv_mtu */
    uint8_t ethernet;
    uint8_t gid[16];
    uint16_t lid;
    uint8_t rd_atom;            /* RDMA READs it serves at once per QP */
    uint8_t pad;
    uint32_t recv_slots, slot_size;
    uint32_t qpn[VERBS_MAX_QPS];
    uint32_t psn[VERBS_MAX_QPS];
    char dev[VERBS_MAX_DEVNAME]; /* "rxe0:1 gid 0", for descriptions */
} wire_verbs_info_t;
_Static_assert(sizeof(wire_verbs_info_t) <= sizeof(((pending_conn_t *)0)->extra), "verbs info fits a pending conn");

/* ---- work requests: wr_id points at one of these, tagged by kind ---- */
enum vw_kind { VW_RECV = 1, VW_SEND, VW_CREDIT, VW_OP };

/* Message kinds of a SEND, in the top byte of its immediate; the low 24
 * bits return credits.  A WRITE_WITH_IMM carries the user's immediate. */
enum { VMSG_STREAM = 1, VMSG_CTRL = 2, VMSG_CREDIT = 3 };
#define VMSG_CREDIT_MASK 0xffffffu

typedef struct vslot {
    uint8_t kind;               /* VW_RECV or VW_SEND */
    uint8_t msg;                /* VMSG_* of a send slot */
    bool posted;
    uint32_t len, off;          /* bytes held; bytes read (receive) */
    uint8_t *buf;
    slime_list_t link;          /* free, ready or received list */
} vslot_t;

typedef struct rmr rmr_t;

/* A one-sided transfer (user RMA, or a rendezvous fetch) in chunks. */
enum vop_role { VOP_RMA = 1, VOP_FETCH };
typedef struct vop {
    uint8_t kind;               /* VW_OP */
    enum vop_role role;
    bool is_read, has_imm, imm_posted;
    bool bound;                 /* raddr/rkey known: its chunks may go */
    uint32_t imm;
    slime_req_t *req;
    uint8_t *laddr;
    uint32_t lkey, rkey;
    uint64_t raddr;
    size_t len, posted;
    unsigned outstanding;       /* work requests not completed yet */
    rmr_t *rmr;                 /* VOP_RMA: the validated remote region */
    regent_t *reg;              /* VOP_FETCH: the local buffer's registration */
    uint64_t sreq;              /* VOP_FETCH: the sender's request id */
    slime_list_t link;          /* conn->ops */
    slime_list_t qlink;         /* conn->post_q, or an rmr's waiters */
    slime_list_t ilink;         /* conn->imm_q: write_imms in posting order */
} vop_t;

/* ---- one endpoint (verbs_conn.c) ---- */
struct verbs_conn {
    verbs_dev_t *dev;
    slime_ctx_t *ctx;
    slime_ep_t *ep;             /* set once the core attached us */
    int sock, epfd;
    bool same_host;             /* sock_same_host(sock): the peer shares ours */
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    bool armed;
    int n_qps;
    struct ibv_qp *qp[VERBS_MAX_QPS];
    uint32_t psn[VERBS_MAX_QPS];
    uint32_t sq_used;           /* QP 0's sends (stream, control, credits) */
    uint32_t sq_cap;
    uint32_t rd_used[VERBS_MAX_QPS]; /* RDMA work requests per QP */
    unsigned next_qp;
    /* bounce slots for the stream and control messages */
    uint8_t *mem;
    struct ibv_mr *mem_mr;
    vslot_t *tx, *rx;
    uint32_t tx_size;           /* bytes per send slot (<= the peer's receive slot) */
    slime_list_t tx_free, tx_ready, rx_got;
    slime_list_t ctrl_backlog;  /* control messages waiting for a slot */
    uint32_t credits;           /* receives the peer has posted for us */
    /* The peer's QPs take packets.  An acceptor's QPs are up before the
     * dialer's: what it posted in between would be dropped and resent
     * only when the retry timer fires (seconds), so it posts nothing
     * until the dialer's ready byte or first message arrives. */
    bool peer_ready;
    uint32_t to_return;         /* receives we reposted and not yet told */
    uint8_t credit_wr;          /* wr_id target of credit-only sends (VW_CREDIT) */
    /* one-sided ops */
    slime_list_t ops, post_q, imm_q;
    slime_list_t rmrs;          /* remote regions we validated (verbs_rkeys.c) */
    uint64_t *peer_pins;        /* bitmap: MR slots of ours the peer validated */
    slime_list_t offers;        /* rendezvous buffers exposed to the peer */
    uint64_t quiet_since_ns;    /* last completion, or the post that ended an idle spell */
    char desc[256];
};

slime_status_t vconn_new(slime_ctx_t *ctx, int n_qps, verbs_conn_t **out);
void vconn_info(const verbs_conn_t *c, wire_verbs_info_t *out);
/* Brings the QPs to RTS against the peer's info; its slot sizes too. */
slime_status_t vconn_connect(verbs_conn_t *c, const wire_verbs_info_t *peer);
/* Takes ownership of sock and builds the epoll set; -1 on failure. */
int vconn_set_socket(verbs_conn_t *c, int sock);
void vconn_free(verbs_conn_t *c);
bool verbs_info_valid(const wire_verbs_info_t *in, char *why, size_t whylen);

/* ---- the stream and completions (verbs_stream.c) ---- */
/* The transport ops of the stream. */
ssize_t verbs_read(slime_ep_t *ep, void *dst, size_t n);
ssize_t verbs_writev(slime_ep_t *ep, const struct iovec *iov, int n);
bool verbs_rx_ready(slime_ep_t *ep);
void verbs_fd_event(slime_ep_t *ep, uint32_t events);
void verbs_close_ep(slime_ep_t *ep);
bool verbs_tx_unsent(slime_ep_t *ep);
/* Posts what waits for credits or queue room; false if the ep failed. */
bool vconn_kick(slime_ep_t *ep);
/* Queues a control message (verbs_rkeys.c builds them); false if the
 * ep failed. */
bool vconn_send_ctrl(slime_ep_t *ep, const void *msg, size_t len);
void vconn_ctrl_free(verbs_conn_t *c);
/* Drains the CQ; false if the endpoint failed meanwhile. */
bool vconn_poll(slime_ep_t *ep);
/* Fails the endpoint from a completion or post error. */
void vconn_fail(slime_ep_t *ep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the stall watchdog (verbs_watchdog.c) ---- */
/* The device's stall limit from $DLSLIME_VERBS_STALL_MS, else a default
 * beyond the RC retries' own limit. */
uint64_t verbs_stall_ns(uint8_t timeout, uint8_t retry_cnt);
/* Before each send-queue post: an idle conn starts its clock. */
void vconn_will_post(verbs_conn_t *c);
/* Fails the endpoint if work requests have waited too long with no
 * completion at all; false if the ep failed. */
bool vconn_watch(slime_ep_t *ep);

/* ---- one-sided ops (verbs_rma.c) ---- */
vop_t *vop_new(verbs_conn_t *c, enum vop_role role, slime_req_t *req);
/* A validated op: queue its chunks. */
void vop_queue(verbs_conn_t *c, vop_t *op);
/* Fails op's request (RMA) with st and frees the op. */
void vop_fail(verbs_conn_t *c, vop_t *op, slime_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Posts queued chunks while queues have room; false if the ep failed. */
bool vops_post(slime_ep_t *ep);
/* A completion of one of op's work requests. */
bool vop_completed(slime_ep_t *ep, vop_t *op);
void vops_free_all(verbs_conn_t *c);
slime_status_t verbs_rma(slime_ep_t *ep, slime_req_t *req, size_t max);
void verbs_rndv_offer(slime_ep_t *ep, slime_req_t *send, frame_t *rts);
slime_status_t verbs_rndv_fetch(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq, uint64_t raddr, uint32_t rkey,
                                uint64_t len);
void verbs_rndv_release(slime_ep_t *ep, slime_req_t *send);
void verbs_offers_free(verbs_conn_t *c);

/* ---- remote region keys: validate once, revoke on dereg (verbs_rkeys.c) ---- */
/* Finds or asks for the region of op (VOP_RMA), then queues op. */
void rkeys_submit(slime_ep_t *ep, vop_t *op);
/* An op that used rmr finished. */
void rkeys_op_done(verbs_conn_t *c, rmr_t *rmr);
/* Whether an op waits for a region's key from the peer's engine. */
bool rkeys_asking(slime_ep_t *ep);
/* A control message arrived; false if the ep failed. */
bool rkeys_on_ctrl(slime_ep_t *ep, const uint8_t *msg, size_t len);
/* The conn closes: unpin what the peer held, drop what we cached. */
void rkeys_conn_close(verbs_conn_t *c);
/* Our region mr is dying (its verbs domain revokes it): every peer that
 * validated its key is told to drop it. */
void rkeys_revoke(slime_ctx_t *ctx, const slime_mr_t *mr);

/* ---- the verbs memory domain (verbs_md.c) ---- */
/* A user region's verbs keys; false if it has none. */
bool verbs_mr_keys(const slime_mr_t *mr, uint32_t *lkey, uint32_t *rkey, bool *writable);
/* The device's keys of a transfer buffer's registration (regcache_get). */
uint32_t regent_lkey(const regent_t *e);
uint32_t regent_rkey(const regent_t *e);
/* slime_ctx_counter's registration counters of the device's cache. */
uint64_t verbs_md_counter(const verbs_dev_t *d, slime_counter_t which);

#endif
