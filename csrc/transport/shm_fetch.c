/* Rendezvous over shm fetched by the receiver: one copy by CMA, straight
 * out of the sender's buffer, instead of two through the rings.
 *
 * Why mostly on a crowded host: the rings pipeline a message, the sender
 * copying in while the receiver copies out, so with a core each the pair
 * moves it about as fast as one CMA copy.  With more of our processes on
 * this host than it has cores, the two copies share a core and cost
 * twice the one.  On a roomy host the rings won past the cache on one
 * machine (AMD, streaming stores), but on another (Intel, 2 cores) the
 * fetch, split with a copy helper (core/team.c), won from 8 MiB
 * (p2p_bench sendrecv, 4 rounds alternating, avg us, rings / fetched: 2
 * MiB 175 / 347, 4 MiB 342 / 471, 8 MiB 736 / 626, 32 MiB 3591 / 2004,
 * 256 MiB 28312 / 21688; through torch 16 MiB 1776 / 1227): there such
 * sizes are fetched too (DLSLIME_SHM_FETCH_ROOMY).
 * Measured through torch (torch_dist_bench send_recv, 4 ranks on 2
 * cores, two pairs ping-ponging, old and new alternating, medians of 4
 * avgs): 1 MiB 258 -> 166 us, 4 MiB 1134 -> 739 us.  Fetching 16 MiB
 * took 3925 us against 2517 by the rings (their streaming stores) then;
 * once a wait on a crowded host yielded its core from the first turn
 * (progress.c), the fetches won up to 16 MiB (4 ranks, rings / fetched,
 * medians of 4 alternating runs: 8 MiB 1479 / 1071 us, 16 MiB 3134 /
 * 2168) and lost from 32 MiB (5113 / 5822, 64 MiB 11897 / 12881), so
 * they stop at DLSLIME_SHM_FETCH_MAX (default 16 MiB).  A collective's
 * chunks keep to the stream whatever the host, and the whole buffers a
 * collective's sender waits on are fetched on any host (send_path_t).
 *
 * DLSLIME_SHM_FETCH: 0 never, 1 on any host (tests), else (default) on
 * a crowded one (ctx_crowded: more peers up on this host, plus this
 * process, than CPUs in our affinity mask) up to DLSLIME_SHM_FETCH_MAX,
 * and on a roomy one from DLSLIME_SHM_FETCH_ROOMY (0: never).  The pid
 * fetched from is the one the kernel vouched for on the connection's
 * socket (SO_PEERCRED). */
#include <stdint.h>
#include <stdlib.h>

#include "transport/cma_fetch.h"
#include "transport/shm_internal.h"

#define FETCH_MAX_DEFAULT (16u << 20)
#define FETCH_ROOMY_DEFAULT (8u << 20)

void shm_fetch_init(shm_conn_t *c) {
    const char *mode = getenv("DLSLIME_SHM_FETCH");
    c->fetch = !c->cma || (mode && mode[0] == '0') ? SHM_FETCH_NEVER
               : mode && mode[0] == '1'            ? SHM_FETCH_ALWAYS
                                                   : SHM_FETCH_CROWDED;
    c->fetch_max = env_size("DLSLIME_SHM_FETCH_MAX", FETCH_MAX_DEFAULT);
    c->fetch_roomy_min =
        env_off("DLSLIME_SHM_FETCH_ROOMY") ? SIZE_MAX : env_size("DLSLIME_SHM_FETCH_ROOMY", FETCH_ROOMY_DEFAULT);
}

/* Whether send's rendezvous is offered to the receiver for fetching. */
static bool fetch_offered(slime_ep_t *ep, const shm_conn_t *c, const slime_req_t *send) {
    if (c->fetch == SHM_FETCH_NEVER || send->path == SEND_PATH_STREAM) return false;
    if (c->fetch == SHM_FETCH_ALWAYS || send->path == SEND_PATH_FETCH) return send->len <= c->fetch_max;
    if (ctx_crowded(ep->ctx)) return send->len <= c->fetch_max;
    return send->len >= c->fetch_roomy_min;
}

void shm_rndv_offer(slime_ep_t *ep, slime_req_t *send, frame_t *rts) {
    if (!fetch_offered(ep, ep->conn, send)) return;
    rts->flags |= FF_RDMA;
    rts->d = (uint64_t)(uintptr_t)send->buf;
    rts->rkey = 0;
}

/* The receiver's half: copied whole here, or, should the kernel refuse
 * any of it (the address the sender named, CMA forbidden here), left to
 * a plain CTS: the stream then rewrites every byte. */
slime_status_t shm_rndv_fetch(slime_ep_t *ep, slime_req_t *recv, uint64_t sreq, uint64_t raddr, uint32_t rkey,
                              uint64_t len) {
    (void)rkey;
    shm_conn_t *c = ep->conn;
    if (!c->cma || !cma_fetch(ep->ctx, (uint32_t)c->peer_pid, recv->buf, raddr, len)) return SLIME_ERR_UNSUPPORTED;
    shm_count_fetch(ep->ctx);
    req_complete(recv, SLIME_OK, NULL);
    proto_rndv_done(ep, sreq, SLIME_OK);
    return SLIME_OK;
}
