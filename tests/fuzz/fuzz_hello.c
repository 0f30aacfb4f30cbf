/* The tcp handshake, both halves.  First byte even: the acceptor's,
 * through the core's pending-connection path (core/handshake.c) and the
 * tcp transport's hello reader, the rest of the input arriving on the
 * socket (after a hello that passes, the frames of the new endpoint, read
 * by the tcp transport).  Odd: the dialer's check of a welcome. */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"

static void acceptor(slime_ctx_t *ctx, const uint8_t *data, size_t size) {
    int sv[2];
    fz_socketpair(SOCK_STREAM, sv);
    (void)send(sv[1], data, size, MSG_DONTWAIT | MSG_NOSIGNAL); /* what fits a socket buffer: all of any -max_len below 100k */
    shutdown(sv[1], SHUT_WR);
    pthread_mutex_lock(&ctx->lock);
    pending_conn_add(ctx, sv[0], WIRE_TRANSPORT_TCP);
    slime_ep_t *ep = list_first(&ctx->accepted, slime_ep_t, acceptq);
    while (ep && ep->state == EP_UP && frames_rx(ep) > 0) {}
    fz_ctx_sweep_locked(ctx);
    pthread_mutex_unlock(&ctx->lock);
    close(sv[1]);
}

static void dialer(slime_ctx_t *ctx, const uint8_t *data, size_t size) {
    wire_welcome_t w;
    memset(&w, 0, sizeof w);
    memcpy(&w, data, min_sz(size, sizeof w));
    (void)welcome_check(ctx, &w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    slime_ctx_t *ctx = fz_ctx_shared();
    if (data[0] % 2 == 0) acceptor(ctx, data + 1, size - 1);
    else dialer(ctx, data + 1, size - 1);
    return 0;
}
