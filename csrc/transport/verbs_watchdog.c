/* The stall watchdog: a backstop for a device that neither completes nor
 * fails work requests.
 *
 * A lost peer shows on the liveness socket, and a lost path as a
 * retry-exceeded completion once the RC retries run out.  A provider can
 * still sit on a request forever (soft-RoCE was seen to hang an RDMA READ
 * under packet reordering): every op on the endpoint would then wait out
 * its caller's timeout, again and again.  So when work requests are
 * outstanding and no completion at all has come for stall_ns, the
 * endpoint fails with SLIME_ERR_PEER_LOST, as on any other broken path.
 *
 * Completions of any kind reset the clock (verbs_stream.c: vconn_poll),
 * so a busy endpoint with a slow op never trips it; the default lies
 * beyond what the RC retries take to report a real loss by themselves. */
#ifdef SLIME_HAVE_VERBS

#include <stdlib.h>

#include "transport/verbs_internal.h"

#define STALL_MIN_NS (10ull * 1000000000ull)

uint64_t verbs_stall_ns(uint8_t timeout, uint8_t retry_cnt) {
    const char *env = getenv("DLSLIME_VERBS_STALL_MS");
    if (env && *env) return env_size("DLSLIME_VERBS_STALL_MS", 0) * 1000000ull;
    /* twice the RC transport's own limit: (retries + 1) ack timeouts */
    uint64_t ack_ns = 4096ull << timeout;
    uint64_t rc_ns = ack_ns * (retry_cnt + 1u);
    return 2 * rc_ns > STALL_MIN_NS ? 2 * rc_ns : STALL_MIN_NS;
}

static unsigned outstanding(const verbs_conn_t *c) {
    unsigned n = c->sq_used;
    for (int q = 0; q < c->n_qps; q++) n += c->rd_used[q];
    return n;
}

void vconn_will_post(verbs_conn_t *c) {
    if (outstanding(c) == 0) c->quiet_since_ns = now_ns();
}

bool vconn_watch(slime_ep_t *ep) {
    verbs_conn_t *c = ep->conn;
    uint64_t limit = c->dev->stall_ns;
    unsigned n;
    if (!limit || (n = outstanding(c)) == 0) return true;
    uint64_t quiet = now_ns() - c->quiet_since_ns;
    if (quiet < limit) return true;
    vconn_fail(ep,
               "no work completion for %.1f s with %u work requests outstanding: the device stalled "
               "(DLSLIME_VERBS_STALL_MS=%llu)",
               (double)quiet / 1e9, n, (unsigned long long)(limit / 1000000ull));
    return false;
}

#else
typedef int verbs_watchdog_unused;
#endif
