/* The verbs transport where the build had no <infiniband/verbs.h>:
 * DLSLIME_TRANSPORT=verbs fails with a clear error, auto never picks it,
 * and an incoming verbs hello is refused by hello_accept (ctx->verbs is
 * NULL), so none of these ops is ever reached with a live connection. */
#ifndef SLIME_HAVE_VERBS

#include "transport/transport.h"
#include "transport/verbs.h"

slime_status_t verbs_open(slime_ctx_t *ctx, bool forced) {
    ctx->verbs = NULL;
    if (!forced) return SLIME_OK;
    return slime_errorf(SLIME_ERR_UNSUPPORTED,
                        "transport 'verbs' is not in this build: <infiniband/verbs.h> was missing when "
                        "libdlslime was built (install libibverbs-dev and rebuild)");
}

void verbs_close(slime_ctx_t *ctx) { (void)ctx; }
uint64_t verbs_counter(const slime_ctx_t *ctx, slime_counter_t which) {
    (void)ctx;
    (void)which;
    return 0;
}

static slime_status_t stub_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline, void **conn, int *fd,
                                wire_welcome_t *w) {
    (void)ctx;
    (void)peer;
    (void)deadline;
    (void)conn;
    (void)fd;
    (void)w;
    return slime_errorf(SLIME_ERR_UNSUPPORTED, "transport 'verbs' is not in this build");
}
static int stub_read_hello(slime_ctx_t *ctx, pending_conn_t *pc) { (void)ctx; (void)pc; return -1; }
static slime_status_t stub_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc, const wire_welcome_t *w, void **conn) {
    (void)ctx;
    (void)pc;
    (void)w;
    (void)conn;
    return SLIME_ERR_UNSUPPORTED;
}
static ssize_t stub_read(slime_ep_t *ep, void *dst, size_t n) { (void)ep; (void)dst; (void)n; return 0; }
static ssize_t stub_writev(slime_ep_t *ep, const struct iovec *iov, int n) { (void)ep; (void)iov; (void)n; return 0; }
static bool stub_rx_ready(slime_ep_t *ep) { (void)ep; return false; }
static void stub_fd_event(slime_ep_t *ep, uint32_t events) { (void)ep; (void)events; }
static void stub_close(slime_ep_t *ep) { (void)ep; }

const transport_ops_t slime_verbs_transport = {
    .name = "verbs",
    .wire = WIRE_TRANSPORT_VERBS,
    .dial = stub_dial,
    .read_hello = stub_read_hello,
    .send_welcome = stub_send_welcome,
    .read = stub_read,
    .writev = stub_writev,
    .rx_ready = stub_rx_ready,
    .fd_event = stub_fd_event,
    .close = stub_close,
};

#else
typedef int verbs_stub_unused; /* ISO C wants something in a translation unit */
#endif
