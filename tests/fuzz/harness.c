/* The fuzz targets' shared parts (fuzz.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz.h"

static void die(const char *what) {
    fprintf(stderr, "fuzz harness: %s: %s\n", what, slime_last_error());
    abort();
}

slime_ctx_t *fz_ctx_new(void) {
    /* a small cap on unexpected bytes: an input's announced sizes then
     * reach the cap's checks without the run allocating its default */
    setenv("DLSLIME_UNEXPECTED_MAX", "1048576", 0);
    slime_ctx_opts_t o;
    slime_ctx_opts_init(&o);
    o.transport = "auto";
    o.tcp_host = "127.0.0.1";
    o.token = FZ_TOKEN;
    o.token_len = strlen(FZ_TOKEN);
    slime_ctx_t *ctx;
    if (slime_ctx_create(&o, &ctx) != SLIME_OK) die("ctx_create");
    return ctx;
}

slime_ctx_t *fz_ctx_shared(void) {
    static slime_ctx_t *ctx;
    if (!ctx) ctx = fz_ctx_new();
    return ctx;
}

/* ---- fz_wire: the peer's byte stream ---- */

static ssize_t wire_read(slime_ep_t *ep, void *dst, size_t n) {
    fz_stream_t *s = ep->conn;
    n = s->open ? min_sz(n, s->n) : 0;
    memcpy(dst, s->p, n);
    s->p += n;
    s->n -= n;
    return (ssize_t)n;
}

/* Every byte the core sends is read, so that ASan checks that what it
 * hands out (a region's bytes for a read, a send's buffer) is memory it
 * may read. */
static ssize_t wire_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    (void)ep;
    static volatile uint8_t sink __attribute__((unused));
    size_t all = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        uint8_t x = 0;
        for (size_t k = 0; k < iov[i].iov_len; k++) x ^= p[k];
        sink = x;
        all += iov[i].iov_len;
    }
    return (ssize_t)all;
}

static bool wire_rx_ready(slime_ep_t *ep) {
    const fz_stream_t *s = ep->conn;
    return s->open && s->n > 0;
}
static void wire_fd_event(slime_ep_t *ep, uint32_t events) { (void)ep, (void)events; }
static void wire_close(slime_ep_t *ep) { (void)ep; }

/* wire id 7: no transport of the provider table has it */
static const transport_ops_t fz_wire = {
    .size = sizeof(transport_ops_t),
    .name = "fuzz",
    .wire = TRANSPORT_MAX - 1,
    .read = wire_read,
    .writev = wire_writev,
    .rx_ready = wire_rx_ready,
    .fd_event = wire_fd_event,
    .close = wire_close,
};

slime_ep_t *fz_ep_new(slime_ctx_t *ctx, fz_stream_t *s) {
    pthread_mutex_lock(&ctx->lock);
    slime_ep_t *ep = ep_new(ctx, FZ_PEER_ID);
    if (!ep) die("ep_new");
    ep->peer_job = ctx->job;
    ep->holds++; /* the target's, as an application's connect hands out: a failed one is not reaped under it */
    ep_attach(ep, &fz_wire, s, -1, 1);
    /* small sends go whole (RPC headers), fz_ops_t's send by rendezvous */
    ep->eager = 1024;
    pthread_mutex_unlock(&ctx->lock);
    return ep;
}

void fz_ep_rx(slime_ep_t *ep) {
    pthread_mutex_lock(&ep->ctx->lock);
    ((fz_stream_t *)ep->conn)->open = true;
    while (ep->state == EP_UP && frames_rx(ep) > 0) {}
    pthread_mutex_unlock(&ep->ctx->lock);
}

static bool any_tag(uint64_t tag, void *arg) { (void)tag, (void)arg; return true; }

void fz_ep_drop_locked(slime_ep_t *ep) {
    ep_fail(ep, SLIME_ERR_CLOSED, "fuzz input done");
    proto_drop_unexpected(ep->ctx, any_tag, NULL); /* eager ones still name ep */
    list_del(&ep->acceptq);
    /* the context lets go; requests still naming it free it with theirs */
    ep_orphan(ep);
}

void fz_ep_drop(slime_ep_t *ep) {
    slime_ctx_t *ctx = ep->ctx;
    pthread_mutex_lock(&ctx->lock);
    fz_ep_drop_locked(ep);
    pthread_mutex_unlock(&ctx->lock);
}

void fz_ctx_sweep_locked(slime_ctx_t *ctx) {
    pending_conn_evict(ctx, SIZE_MAX);
    while (!list_empty(&ctx->eps)) fz_ep_drop_locked(container_of(ctx->eps.next, slime_ep_t, link));
}

/* ---- what the peer's frames can name ---- */

static uint8_t region[FZ_REGION_LEN], rbuf[256], sbuf[4096];
static float reduce_buf[64];

void fz_ops_post(slime_ctx_t *ctx, slime_ep_t *ep, fz_ops_t *ops) {
    memset(ops, 0, sizeof *ops);
    if (slime_mr_reg(ctx, region, sizeof region, SLIME_ACCESS_ALL, &ops->mr) != SLIME_OK) die("mr_reg");
    /* a fixed key, here and in the shared table, so that seeds can name it */
    ops->mr->rkey = FZ_RKEY;
    ctx->mr_table->slots[ops->mr->slot].rkey = FZ_RKEY;
    slime_mr_desc_t d;
    if (slime_mr_desc(ops->mr, &d) != SLIME_OK) die("mr_desc");
    /* ...and the peer's region, for our read and write: the same bytes
     * under the peer's id (its descriptor) */
    wire_desc_t *wd = (wire_desc_t *)d.bytes;
    wd->ctx_id = FZ_PEER_ID;
    if (slime_recv(ep, rbuf, sizeof rbuf, 1, &ops->recv) != SLIME_OK ||
        slime_recv_reduce(ep, reduce_buf, 64, SLIME_DT_FLOAT32, SLIME_RED_SUM, 2, &ops->reduce) != SLIME_OK ||
        slime_send(ep, sbuf, sizeof sbuf, 3, &ops->send) != SLIME_OK ||
        slime_read(ep, ops->mr, 0, &d, 64, 64, &ops->read) != SLIME_OK ||
        slime_write(ep, ops->mr, 128, &d, 256, 64, &ops->write) != SLIME_OK ||
        slime_imm_recv(ep, &ops->imm) != SLIME_OK)
        die("posting");
}

void fz_ops_free(fz_ops_t *ops) {
    slime_req_t *all[] = {ops->recv, ops->reduce, ops->send, ops->read, ops->write, ops->imm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) slime_req_free(all[i]);
    slime_mr_dereg(ops->mr);
}

void fz_socketpair(int type, int sv[2]) {
    if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("fuzz harness: socketpair");
        abort();
    }
}
