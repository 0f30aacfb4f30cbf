/* Shared boxes: the core's side of p2p_box_t.  The transport owns the
 * memory (box_slots, box_open, box_release); the core only keeps, per
 * endpoint, which slots a layer above has taken here, so that two
 * communicators of one process never share a slot, and lets a layer that
 * waits on a box say so to peer liveness. */
#include "core/internal.h"
#include "transport/transport.h"

static uint32_t slots_mask(slime_ep_t *ep) {
    if (ep->state != EP_UP || !ep->tp->box_slots) return 0;
    int n = ep->tp->box_slots(ep);
    if (n <= 0) return 0;
    return n >= 32 ? UINT32_MAX : (1u << n) - 1;
}

uint32_t p2p_box_reserve(slime_ep_t *ep) {
    if (!ep) return 0;
    pthread_mutex_lock(&ep->ctx->lock);
    uint32_t free_here = slots_mask(ep) & ~ep->box_taken;
    ep->box_taken |= free_here;
    pthread_mutex_unlock(&ep->ctx->lock);
    return free_here;
}

void p2p_box_unreserve(slime_ep_t *ep, uint32_t slots) {
    if (!ep || !slots) return;
    pthread_mutex_lock(&ep->ctx->lock);
    ep->box_taken &= ~slots;
    pthread_mutex_unlock(&ep->ctx->lock);
}

bool p2p_box_open(slime_ep_t *ep, int slot, p2p_box_t *box) {
    if (!ep || slot < 0 || slot >= 32) return false;
    uint32_t bit = 1u << slot;
    pthread_mutex_lock(&ep->ctx->lock);
    bool ok = (ep->box_taken & bit) && (slots_mask(ep) & bit) && ep->tp->box_open(ep, slot, box);
    if (ok) {
        box->slot = slot;
        box->ep = ep;
        ep_ref(ep);
    } else {
        ep->box_taken &= ~bit;
    }
    pthread_mutex_unlock(&ep->ctx->lock);
    return ok;
}

void p2p_box_close(p2p_box_t *box) {
    slime_ep_t *ep = box->ep;
    if (!ep) return;
    pthread_mutex_lock(&ep->ctx->lock);
    ep->box_taken &= ~(1u << box->slot);
    ep->tp->box_release(box->hold);
    pthread_mutex_unlock(&ep->ctx->lock);
    box->ep = NULL;
    box->hold = NULL;
    ep_unref(ep);
}

void p2p_ep_wait_begin(slime_ep_t *ep) {
    atomic_fetch_add(&ep->outside_waits, 1);
    /* a progress thread in its long sleep would look at the peer late */
    ctx_rouse_long_sleeper(ep->ctx);
}

void p2p_ep_wait_end(slime_ep_t *ep) { atomic_fetch_sub(&ep->outside_waits, 1); }

void p2p_count_box_op(slime_ctx_t *ctx) { atomic_fetch_add_explicit(&ctx->box_ops, 1, memory_order_relaxed); }
