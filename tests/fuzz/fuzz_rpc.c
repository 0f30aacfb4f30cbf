/* The RPC server's decoding of what a client sends (csrc/rpc): mailbox
 * messages (hellos, requests inline or announcing a bulk payload) and the
 * bulk payloads, carried by frames as a connected client's would be.  The
 * server answers what it takes (an echo), so the reply path reads the
 * client's announced sizes too.  A fresh context per input, as for
 * frames. */
#include <stdlib.h>

#include "fuzz.h"
#include "dlslime/rpc.h"

static void drain(slime_rpc_server_t *srv) {
    slime_rpc_call_t *call;
    while (slime_rpc_server_next(srv, 0, &call) == SLIME_OK) {
        size_t len = 0;
        const void *in = slime_rpc_call_data(call, &len);
        (void)slime_rpc_call_reply(call, in, len, 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* announced payloads up to 1 MiB are taken; past it, the budget's refusal */
    setenv("DLSLIME_RPC_BULK_BUDGET", "1048576", 0);
    slime_ctx_t *ctx = fz_ctx_new();
    fz_stream_t s = {data, size, false};
    slime_ep_t *ep = fz_ep_new(ctx, &s);
    slime_rpc_opts_t o;
    slime_rpc_opts_init(&o);
    o.slot_size = SLIME_RPC_SLOT_MIN;
    o.credits = 4;
    o.max_slots = 8;
    uint64_t method = FZ_RPC_METHOD;
    slime_rpc_server_t *srv;
    if (slime_rpc_server_create(ctx, FZ_RPC_PORT, FZ_RPC_DIGEST, &method, 1, &o, &srv) != SLIME_OK) abort();
    fz_ep_rx(ep);
    drain(srv);
    /* the server goes first: a reply still queued to the client is
     * freed when the context fails it */
    slime_rpc_server_destroy(srv);
    fz_ep_drop(ep);
    slime_ctx_destroy(ctx);
    return 0;
}
