/* What one peer may make us hold.  Everything a peer's frames leave
 * behind until our application or the peer itself takes it (messages
 * and rendezvous announcements nobody has received, replies to its
 * requests that it has not read, immediates nobody asked for) is an item
 * held for that peer, and a peer holds at most DLSLIME_PEER_ITEMS_MAX of
 * them.  None of these can be slowed down without stalling the replies
 * the peer is owed on the same stream, and no genuine peer of ours gets
 * near the budget, so one over it is disconnected, named in the error.
 * The bytes of unexpected eager payloads have their own cap
 * (DLSLIME_UNEXPECTED_MAX, proto.c), which pauses the stream instead. */
#include <inttypes.h>

#include "core/internal.h"

/* About 1.5 MiB of bookkeeping per peer at most. */
#define PEER_ITEMS_MAX 16384

void budget_init(slime_ctx_t *ctx) { ctx->peer_items_max = env_size("DLSLIME_PEER_ITEMS_MAX", PEER_ITEMS_MAX); }

bool ep_hold(slime_ep_t *ep, const char *what) {
    if (ep->held < ep->ctx->peer_items_max) {
        ep->held++;
        return true;
    }
    ep_fail(ep, SLIME_ERR_PROTOCOL,
            "peer %016" PRIx64 " is over its budget of %zu items held here (DLSLIME_PEER_ITEMS_MAX), with %s: "
            "disconnected",
            ep->peer_id, ep->ctx->peer_items_max, what);
    /* what it sent unasked goes with it (ep_fail keeps a lost peer's
     * messages for their receives: these are the flood) */
    slime_list_t *pos, *tmp;
    list_for_each_safe(pos, tmp, &ep->ctx->unexpected) {
        umsg_t *m = container_of(pos, umsg_t, link);
        if (m->ep == ep) umsg_free(ep->ctx, m);
    }
    return false;
}

void ep_unhold(slime_ep_t *ep) {
    if (ep->held) ep->held--;
}
