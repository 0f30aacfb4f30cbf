/* The verbs transport's table and what a context keeps of it: the RDMA
 * device it opened (verbs_dev.c), reached through verbs_dev_of.  Its
 * dialer connects to the peer's tcp listener (verbs_handshake.c). */
#ifdef SLIME_HAVE_VERBS

#include "transport/verbs_internal.h"

/* In auto mode, and with another transport forced, a context without a
 * usable device simply has no verbs; forced, it fails to open. */
static slime_status_t verbs_ctx_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, enum tp_mode mode,
                                     void **state) {
    (void)ctx;
    (void)opts;
    verbs_dev_t *d;
    slime_status_t st = verbs_dev_open(mode == TP_FORCED, &d);
    *state = d;
    return st;
}

static void verbs_ctx_close(void *state) { verbs_dev_close(state); }

static void verbs_address(const void *state, wire_addr_t *a) {
    (void)state;
    a->flags |= ADDR_HAS_VERBS;
}

/* The peer has a device, and the tcp listener its handshake goes through. */
static int verbs_reach(const slime_ctx_t *ctx, const void *state, const wire_addr_t *peer) {
    (void)ctx;
    (void)state;
    bool ok = (peer->flags & ADDR_HAS_VERBS) && (peer->flags & ADDR_HAS_TCP) && peer->n_hosts;
    return ok ? TP_REACH_FABRIC : TP_REACH_NONE;
}

static uint64_t verbs_counter(const void *state, slime_counter_t which) {
    return verbs_md_counter(state, which);
}

const transport_ops_t slime_verbs_transport = {
    .size = sizeof(transport_ops_t),
    .name = "verbs",
    .wire = WIRE_TRANSPORT_VERBS,
    .eager_env = "DLSLIME_EAGER_VERBS",
    .eager_default = 64 * 1024,
    .absent = "has no usable RDMA device",
    .via = WIRE_TRANSPORT_TCP,
    .ctx_open = verbs_ctx_open,
    .ctx_close = verbs_ctx_close,
    .address = verbs_address,
    .reach = verbs_reach,
    .counter = verbs_counter,
    .dial = verbs_dial,
    .read_hello = verbs_read_hello,
    .send_welcome = verbs_send_welcome,
    .read = verbs_read,
    .writev = verbs_writev,
    .rx_ready = verbs_rx_ready,
    .fd_event = verbs_fd_event,
    .rma = verbs_rma,
    .close = verbs_close_ep,
    .rma_async = true,
    .conn_fd = verbs_conn_fd,
    .rndv_offer = verbs_rndv_offer,
    .rndv_fetch = verbs_rndv_fetch,
    .rndv_release = verbs_rndv_release,
    .describe = verbs_describe,
    .peer_local = verbs_peer_local,
    .waits_on_peer = rkeys_asking,
    .tx_unsent = verbs_tx_unsent,
};

#else
typedef int verbs_transport_unused;
#endif
