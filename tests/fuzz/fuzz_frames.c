/* The frame decoder (core/frames.c, core/proto.c): the input is what a
 * connected peer sends, frames of every type, against a context with a
 * region, posted receives (plain and combining), a rendezvous send, a
 * read, a write and an immediate wait for its frames to answer.  A fresh
 * context per input: request ids, and so a crash, depend on the input
 * alone. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    slime_ctx_t *ctx = fz_ctx_new();
    fz_stream_t s = {data, size, false};
    slime_ep_t *ep = fz_ep_new(ctx, &s);
    fz_ops_t ops;
    fz_ops_post(ctx, ep, &ops);
    fz_ep_rx(ep);
    fz_ep_drop(ep);
    fz_ops_free(&ops);
    slime_ctx_destroy(ctx);
    return 0;
}
