/* The shm transport, for two contexts on one host.
 *
 * Each connection is a shared segment holding two single-producer rings
 * (one per direction) that carry the frame stream, plus a SEQPACKET
 * unix socket that passes the segment at the handshake, rings doorbells
 * for a peer that sleeps, and hangs up when the peer process dies.
 * Large two-sided messages are copied in and out of the ring at once by
 * both processes (two cores working); one-sided ops go by single-copy
 * process_vm_readv/writev (CMA), checked against the peer's shared MR
 * table, and fall back to frames when the kernel refuses CMA.  This file
 * is the transport's table, what a context keeps of it, and the life of
 * a connection; shm_internal.h lists the others. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm_internal.h"
#include "transport/sockio.h"

typedef struct shm_ctx {
    int listen_fd;
    atomic_uint_fast64_t doorbells; /* SLIME_COUNTER_DOORBELLS */
    atomic_uint_fast64_t fetches;   /* SLIME_COUNTER_SHM_FETCHES */
    atomic_uint_fast64_t dead_pins; /* SLIME_COUNTER_DEAD_PEER_PINS */
} shm_ctx_t;

/* Not opened while another transport is forced: nothing would dial it. */
static slime_status_t shm_ctx_open(slime_ctx_t *ctx, const slime_ctx_opts_t *opts, enum tp_mode mode, void **state) {
    (void)opts;
    if (mode == TP_OTHER_FORCED) return SLIME_OK;
    shm_ctx_t *s = malloc(sizeof *s);
    if (!s) return slime_errorf(SLIME_ERR_NOMEM, "shm listener");
    atomic_init(&s->doorbells, 0);
    atomic_init(&s->fetches, 0);
    slime_status_t st = shm_listen(ctx->id, &s->listen_fd);
    if (st != SLIME_OK) {
        free(s);
        return st;
    }
    *state = s;
    return SLIME_OK;
}

static void shm_ctx_close(void *state) {
    shm_ctx_t *s = state;
    close(s->listen_fd);
    free(s);
}

static void shm_address(const void *state, wire_addr_t *a) {
    (void)state;
    a->flags |= ADDR_HAS_SHM;
}

static int shm_reach(const slime_ctx_t *ctx, const void *state, const wire_addr_t *peer) {
    (void)state;
    return (peer->flags & ADDR_HAS_SHM) && address_same_host(&ctx->addr, peer) ? TP_REACH_HOST : TP_REACH_NONE;
}

static int shm_listen_fd(const void *state) { return ((const shm_ctx_t *)state)->listen_fd; }

void shm_count_doorbell(slime_ctx_t *ctx) {
    shm_ctx_t *s = ctx_tp_state(ctx, WIRE_TRANSPORT_SHM);
    if (s) atomic_fetch_add_explicit(&s->doorbells, 1, memory_order_relaxed);
}

void shm_count_fetch(slime_ctx_t *ctx) {
    shm_ctx_t *s = ctx_tp_state(ctx, WIRE_TRANSPORT_SHM);
    if (s) atomic_fetch_add_explicit(&s->fetches, 1, memory_order_relaxed);
}

void shm_count_dead_pins(slime_ctx_t *ctx, uint64_t n) {
    shm_ctx_t *s = ctx_tp_state(ctx, WIRE_TRANSPORT_SHM);
    if (s) atomic_fetch_add_explicit(&s->dead_pins, n, memory_order_relaxed);
}

static uint64_t shm_counter(const void *state, slime_counter_t which) {
    const shm_ctx_t *s = state;
    return which == SLIME_COUNTER_DOORBELLS    ? atomic_load(&s->doorbells)
           : which == SLIME_COUNTER_SHM_FETCHES ? atomic_load(&s->fetches)
           : which == SLIME_COUNTER_DEAD_PEER_PINS ? atomic_load(&s->dead_pins)
                                                : 0;
}

static bool shm_accept(slime_ctx_t *ctx, void *state) {
    return sock_accept_pending(ctx, shm_listen_fd(state), WIRE_TRANSPORT_SHM, NULL);
}

int shm_peer_pid(int sock) {
    struct ucred cr;
    socklen_t l = sizeof cr;
    return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 ? cr.pid : 0;
}

void *shm_map(int fd, size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A ring's pages are otherwise first touched by the first large messages,
 * which then pay a fault (and, for the first toucher, the page's
 * allocation and zeroing) per 4 KiB page on both sides, and a stream of
 * 64 KiB messages pays it until the ring has wrapped once.  So the segment
 * is mapped populated (MAP_POPULATE faults around, 16 pages a fault: 8 MiB
 * in 0.9 ms where MADV_POPULATE_WRITE took 2.5), its creator allocating
 * the pages first with fallocate (2.2 ms for 8 MiB).  That moves the cost
 * from the first transfer to the connect: a fresh pair's first 4 MiB
 * ping-pong took a median 22.7 ms and now 6.8 (warm: 1.5-4), its connect
 * 0.2 and now 8.8 ms (9 pairs each, interleaved, loaded machine; about 4
 * ms quiet).  Bounded, since a dialer chooses its ring's size (and the
 * acceptor maps it before the hello is checked): a segment of rings over
 * 8 MiB (sixteen times the default) is faulted lazily. */
#define SEG_POPULATE_MAX shm_seg_size(8u << 20)

void *shm_map_ring(int fd, size_t len, bool creator) {
    int flags = MAP_SHARED;
    if (len <= SEG_POPULATE_MAX) {
        if (creator) (void)fallocate(fd, 0, 0, (off_t)len); /* on failure the faults allocate */
        flags |= MAP_POPULATE;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* The piece a side copies into or out of a ring before it publishes it
 * (DLSLIME_SHM_CHUNK).  A message moves as a pipeline, the receiver
 * copying one piece out while the sender copies the next in, so the
 * first and last pieces are the time only one core copies: smaller pieces
 * shorten them, at the cost of a publish and a look per piece.  p2p_bench
 * sendrecv, 256 KiB against 64 KiB taking turns (Intel, 2 cores, 4 MiB of
 * L2; avg us): 128 KiB 13.9 -> 11.7, 256 KiB 26.6 -> 19.9, 1 MiB 98 ->
 * 92, 4 MiB 380 -> 359; 16 MiB to 256 MiB, all_reduce and broadcast level
 * or better.  32 KiB made a 128 KiB all_reduce slower.  Sends whose
 * receiver only copies cut finer pieces (shm_ring.c, SHM_FINE_PIECE). */
#define SHM_CHUNK (64u << 10)

shm_conn_t *shm_conn_new(int sock, uint8_t *seg, size_t seg_len, uint64_t ring, mr_shared_t *peer, bool dialer) {
    shm_conn_t *c = calloc(1, sizeof *c);
    shm_mapping_t *m = malloc(sizeof *m);
    uint64_t *stale = calloc((ring / SHM_LINE + 63) / 64, sizeof *stale);
    if (!c || !m || !stale) {
        free(c);
        free(m);
        free(stale);
        return NULL;
    }
    c->tx_stale = stale;
    *m = (shm_mapping_t){.addr = seg, .len = seg_len};
    atomic_init(&m->refs, 1);
    seg_hdr_t *h = (seg_hdr_t *)seg;
    c->sock = sock;
    c->seg = m;
    c->dialer = dialer;
    c->size = ring;
    /* no larger than the ring: a copy wraps around it at most once, even
     * where the peer has scribbled over the ring's head and tail */
    c->chunk = min_sz(env_size("DLSLIME_SHM_CHUNK", SHM_CHUNK), ring);
    _Atomic uint32_t *pins = (_Atomic uint32_t *)(seg + SEG_HDR + SHM_BOX_AREA);
    c->my_pins = dialer ? pins : pins + MR_TABLE_SLOTS;
    c->peer_pins = dialer ? pins + MR_TABLE_SLOTS : pins;
    uint8_t *d0 = seg + SEG_HDR + SHM_BOX_AREA + SHM_PINS_AREA, *d1 = d0 + ring;
    c->tx = &h->ring[dialer ? 0 : 1];
    c->rx = &h->ring[dialer ? 1 : 0];
    c->txd = dialer ? d0 : d1;
    c->rxd = dialer ? d1 : d0;
    c->peer = peer;
    c->peer_pid = shm_peer_pid(sock);
    c->cma = c->peer_pid > 0 && !env_off("DLSLIME_SHM_CMA");
    c->cma_max = env_size("DLSLIME_SHM_CMA_MAX", CMA_MAX);
    /* DLSLIME_SHM_MAP=0: CMA even for the peer's shared blocks (to compare) */
    c->map = c->cma && !env_off("DLSLIME_SHM_MAP") ? peermap_new(c->peer_pid, peer) : NULL;
    shm_fetch_init(c);
    return c;
}

static void shm_close(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    if (!c) return;
    shm_pins_reclaim(ep->ctx, c);
    close(c->sock);
    shm_mapping_put(c->seg);
    peermap_free(c->map);
    munmap(c->peer, sizeof(mr_shared_t));
    free(c->tx_stale);
    free(c);
    ep->conn = NULL;
}

/* Sends up to this size go eagerly (DLSLIME_EAGER_SHM): the rings pipeline
 * an eager payload just as they do a rendezvous's DATA (both sides copy at
 * once, a chunk apart), so a rendezvous only adds the RTS/CTS round trip,
 * which cost more than the copy up to here.  p2p_bench sendrecv, p50 of 4
 * interleaved rounds (loaded 2-core machine): 64 KiB+1 22.9 -> 10.4 us,
 * 128 KiB 27.8 -> 15.5, 256 KiB 38.6 -> 25.3.  Past it the rendezvous
 * keeps a large message out of the unexpected queue's private copy. */
#define SHM_EAGER (256u << 10)

static int shm_verified_pid(const void *conn) { return ((const shm_conn_t *)conn)->peer_pid; }

static bool shm_peer_local(const void *conn) {
    (void)conn;
    return true; /* a shm peer maps our segment: it shares the host */
}

const transport_ops_t slime_shm_transport = {
    .size = sizeof(transport_ops_t),
    .name = "shm",
    .wire = WIRE_TRANSPORT_SHM,
    .caps = TP_CAP_POLLED | TP_CAP_CPU_RMA,
    .rndv_offer = shm_rndv_offer,
    .rndv_fetch = shm_rndv_fetch,
    .eager_env = "DLSLIME_EAGER_SHM",
    .eager_default = SHM_EAGER,
    .absent = "is not on this host",
    .ctx_open = shm_ctx_open,
    .ctx_close = shm_ctx_close,
    .address = shm_address,
    .reach = shm_reach,
    .listen_fd = shm_listen_fd,
    .accept = shm_accept,
    .dial = shm_dial,
    .read_hello = shm_read_hello,
    .send_welcome = shm_send_welcome,
    .read = shm_read,
    .writev = shm_writev,
    .rx_ready = shm_rx_ready,
    .rx_beyond = shm_rx_beyond,
    .fd_event = shm_fd_event,
    .rma = shm_rma,
    .close = shm_close,
    .has_work = shm_has_work,
    .rx_peek = shm_rx_peek,
    .rx_consume = shm_rx_consume,
    .verified_pid = shm_verified_pid,
    .peer_local = shm_peer_local,
    .box_slots = shm_box_slots,
    .box_open = shm_box_open,
    .box_release = shm_box_release,
    .counter = shm_counter,
};
