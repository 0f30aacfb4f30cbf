/* The frame stream of a shm connection: two single-producer rings in the
 * shared segment, one per direction, of packets (shm_internal.h).  Each
 * side copies in (or out) a chunk at a time and publishes it at once, so
 * the other side copies while it goes on; a side that sleeps is woken by
 * a doorbell byte on the socket, sent only when no thread of the peer
 * polls (mr_shared_t). */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "transport/shm_internal.h"

static void doorbell(slime_ep_t *ep) {
    shm_count_doorbell(ep->ctx);
    /* a full socket queue already guarantees a wake-up */
    char b = 1;
    (void)send(((shm_conn_t *)ep->conn)->sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Nobody of the peer's polls its rings now, nor will soon. */
static bool peer_needs_doorbell(shm_conn_t *c) {
    return atomic_load(&c->peer->polling) == 0 && now_ns() > atomic_load(&c->peer->grace_until);
}

/* An offset into a ring moved on by n (at most the ring's size). */
static size_t ring_advance(const shm_conn_t *c, size_t at, size_t n) {
    at += n;
    return at >= c->size ? at - (size_t)c->size : at;
}

static size_t round_up_line(size_t n) { return (n + SHM_LINE - 1) & ~(size_t)(SHM_LINE - 1); }

/* The bytes a packet of len bytes at ring offset at takes.  A packet of
 * several lines ends on a pair of lines (128 bytes), so that the next
 * one starts on a pair too (the ring is whole pairs by default): the
 * reader's core fetches a line with its pair's other half, and a packet
 * starting on a pair gets its second line with its header.  A one-line
 * packet keeps its one line: two made 8-byte sends slower (0.273 ->
 * 0.307 us).  p2p_bench sendrecv, alternating runs, avg us: 128 B 0.393
 * -> 0.342; 8-64 B and 192 B-2 KiB level. */
static size_t packet_slot(size_t at, size_t len) {
    size_t slot = round_up_line(SHM_PACKET_HDR + len);
    if (slot == SHM_LINE) return slot;
    return slot + ((at + slot) / SHM_LINE & 1) * SHM_LINE;
}

static _Atomic uint64_t *ring_word(uint8_t *ring, size_t at) { return (_Atomic uint64_t *)(void *)(ring + at); }

/* Nobody of the peer's polls its rings now, nor will soon: ring it.
 * After the stores that published, which the fence orders before the
 * look. */
static void ring_if_asleep(slime_ep_t *ep) {
    atomic_thread_fence(memory_order_seq_cst);
    if (peer_needs_doorbell(ep->conn)) doorbell(ep);
}

/* The room after our position, by the head as last read, which is read
 * again only when that leaves less than need: the reader moves the head
 * with every message, so each fresh read is a cache miss. */
static size_t tx_room(shm_conn_t *c, size_t need) {
    size_t room = (size_t)(c->size - (c->tx_pos - c->tx_head_seen));
    if (room >= need) return room;
    c->tx_head_seen = atomic_load_explicit(&c->tx->head, memory_order_acquire);
    return (size_t)(c->size - (c->tx_pos - c->tx_head_seen));
}

/* The payload a packet may carry in room bytes: whole lines, less its
 * header, a line to end on a pair (packet_slot) and the line after it,
 * where the next header goes. */
static size_t packet_fits(size_t room) {
    room &= ~(size_t)(SHM_LINE - 1);
    return room > 2 * SHM_LINE + SHM_PACKET_HDR ? room - 2 * SHM_LINE - SHM_PACKET_HDR : 0;
}

/* Sets (or clears) count bits from bit i of a map of n bits, round. */
static void bits_assign(uint64_t *map, size_t i, size_t count, size_t n, bool set) {
    while (count) {
        size_t run = min_sz(count, min_sz(n - i, 64 - i % 64));
        uint64_t mask = (run == 64 ? ~0ull : ((1ull << run) - 1)) << (i % 64);
        map[i / 64] = set ? map[i / 64] | mask : map[i / 64] & ~mask;
        count -= run;
        i = i + run == n ? 0 : i + run;
    }
}

/* A packet of slot bytes, the first used of them written, goes at
 * tx_at: its first line holds a header from now on, its others up to
 * used payload (a line of padding keeps what it had).  The line after
 * it is where the reader looks next: payload left there by the last lap
 * could read as a header, so it is zeroed first (once a lap, and only
 * after a packet of several lines had been there). */
static void lines_claim(shm_conn_t *c, size_t slot, size_t used) {
    size_t lines = (size_t)c->size / SHM_LINE, first = c->tx_at / SHM_LINE, n = slot / SHM_LINE;
    size_t u = round_up_line(used) / SHM_LINE;
    bits_assign(c->tx_stale, first, 1, lines, false);
    if (u > 1) bits_assign(c->tx_stale, first + 1 == lines ? 0 : first + 1, u - 1, lines, true);
    size_t next = (first + n) % lines;
    if (c->tx_stale[next / 64] >> (next % 64) & 1) {
        atomic_store_explicit(ring_word(c->txd, next * SHM_LINE), 0, memory_order_relaxed);
        bits_assign(c->tx_stale, next, 1, lines, false);
    }
}

/* Where a gather of iovecs has got to. */
typedef struct iov_at {
    const struct iovec *iov;
    int i;
    size_t off;
} iov_at_t;

/* Copies k bytes from the gather into the ring at offset at, round (or
 * only moves the gather on, with no ring). */
static void ring_gather(shm_conn_t *c, uint8_t *ring, size_t at, iov_at_t *g, size_t k) {
    while (k) {
        const struct iovec *v = &g->iov[g->i];
        size_t take = min_sz(min_sz(k, v->iov_len - g->off), (size_t)c->size - at);
        if (ring) memcpy(ring + at, (const uint8_t *)v->iov_base + g->off, take);
        at = ring_advance(c, at, take);
        k -= take;
        g->off += take;
        if (g->off == v->iov_len) {
            g->i++;
            g->off = 0;
        }
    }
}

/* One packet of k bytes of the gather, published: the line after it
 * cleared where need be (first, so that the store has long landed when
 * the header's must wait for it), its bytes, its header last.  Its first
 * line, which the reader polls, is written last of all and at once: a
 * store to it while the reader still polls hands the line back and forth,
 * a trip each time. */
static void packet_write(shm_conn_t *c, iov_at_t *g, size_t k) {
    size_t slot = packet_slot(c->tx_at, k), head = min_sz(k, SHM_LINE - SHM_PACKET_HDR);
    lines_claim(c, slot, SHM_PACKET_HDR + k);
    iov_at_t rest = *g;
    ring_gather(c, NULL, 0, &rest, head);
    ring_gather(c, c->txd, ring_advance(c, c->tx_at, SHM_LINE), &rest, k - head);
    ring_gather(c, c->txd, c->tx_at + SHM_PACKET_HDR, g, head);
    *g = rest;
    atomic_store_explicit(ring_word(c->txd, c->tx_at), shm_packet_header(c->tx_pos, (uint32_t)k),
                          memory_order_release);
    c->tx_pos += slot;
    c->tx_at = ring_advance(c, c->tx_at, slot);
    c->tx_sent += k;
    atomic_store_explicit(&c->tx->tail, c->tx_sent, memory_order_release);
}

/* The payload a packet may carry now, up to want: after asking for a
 * doorbell when the ring is full, and looking again, since the reader
 * may have freed room before it could see the request. */
static size_t tx_fits(shm_conn_t *c, size_t want) {
    size_t fits = packet_fits(tx_room(c, round_up_line(SHM_PACKET_HDR + want) + 2 * SHM_LINE));
    if (fits) return min_sz(fits, want);
    atomic_store_explicit(&c->tx->want_space, 1, memory_order_seq_cst);
    c->tx_head_seen = atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
    return min_sz(packet_fits((size_t)(c->size - (c->tx_pos - c->tx_head_seen))), want);
}

/* The piece a packet carries of a send whose receiver only copies it
 * out: the reader copies one out while we copy the next in, so smaller
 * pieces shorten the stretch where only one of us copies.  p2p_bench
 * sendrecv, 64 KiB pieces against 16 KiB taking turns (avg us): 32 KiB
 * 5.42 -> 4.73, 64 KiB 9.20 -> 7.08, 128 KiB 13.1 -> 11.2, 512 KiB 38.3
 * -> 36.0, 2 and 6 MiB level; through torch, 2 ranks, send_recv 64 KiB
 * 14.9 -> 12.7; broadcast and allgather level (from 32 KiB to 1 MiB
 * their receivers fetch).  A reducing collective's chunks
 * (send_opts_t.coarse) keep DLSLIME_SHM_CHUNK: their reader reduces each
 * piece and sends its own meanwhile, and 16 KiB pieces made a 128 KiB
 * all_reduce 18.2 -> 23.2 us (32 KiB: a 256 KiB one 34.3 -> 36.9). */
#define SHM_FINE_PIECE (16u << 10)

/* A piece a packet: the reader copies one out while we copy the next in.
 * A small frame (header and payload) is one packet, so the reader never
 * finds a header without its payload. */
ssize_t shm_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    shm_conn_t *c = ep->conn;
    size_t total = 0, sent = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    size_t piece = ep->tx_coarse ? (size_t)c->chunk : min_sz(SHM_FINE_PIECE, (size_t)c->chunk);
    iov_at_t g = {.iov = iov};
    while (sent < total) {
        size_t k = tx_fits(c, min_sz(total - sent, piece));
        if (!k) break;
        packet_write(c, &g, k);
        sent += k;
    }
    if (sent) ring_if_asleep(ep);
    return (ssize_t)sent;
}

/* memcpy with non-temporal stores: the destination's lines are not read
 * first (a plain store to a line not in cache fetches it from memory),
 * nor kept in cache.  Measured here, a 64 MiB copy runs at 12 GB/s with
 * memcpy in 128 KiB pieces and 14 GB/s so; two threads at 14 and 20. */
void shm_copy_stream(uint8_t *dst, const uint8_t *src, size_t n) {
#if defined(__SSE2__)
    size_t head = min_sz(n, (size_t)(-(uintptr_t)dst & 15));
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i x = _mm_loadu_si128((const __m128i *)(src + 32)), y = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), x);
        _mm_stream_si128((__m128i *)(dst + 48), y);
    }
    _mm_sfence(); /* the stores are weakly ordered: finish them before the head moves */
#endif
    memcpy(dst, src, n);
}

/* A read with at least this many bytes still to come for its destination
 * streams past the cache: most of such a destination would be evicted
 * before anyone reads it anyway, and skipping the line fills leaves the
 * memory bus to the sender's reads.  Measured first on a machine whose
 * L3 was 32 MiB, shared by both processes (p2p_bench sendrecv, medians
 * of 5): 64 MiB 5.5 -> 6.8-7.0 GB/s, 16 MiB 5.9 -> 6.4-7.1 GB/s with a
 * limit of 4 MiB; 1 MiB made a cache-hot 1 MiB torch ping-pong 3x
 * slower.  On the 2-core Intel machine of the ring's other measurements
 * the rings now carry mostly broadcasts and collectives' chunks there
 * (large sends are fetched), and 16 MiB beat 4 (p2p_bench, alternating,
 * avg us): broadcast 8 MiB 769 -> 696, 16 MiB 1589 -> 1379; sendrecv
 * through the rings (DLSLIME_SHM_FETCH_ROOMY=0) 6 MiB 605 -> 562, 16 MiB
 * 1700 -> 1363; 32 and 64 MiB, allgather and reduce_scatter level.
 * The tail of a message stays in cache for whoever reads it next. */
#define STREAM_MIN (16u << 20)

/* A writer that found the ring full asked for a doorbell (tx_fits):
 * give it one, if it sleeps.  The fence orders the head's store, which
 * gave it room, before the look at its request, against its store of
 * the request before its look at the head. */
static void rx_answer_writer(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    c->rx_head_unfenced = false;
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&c->rx->want_space, memory_order_relaxed)) return;
    atomic_store(&c->rx->want_space, 0);
    if (peer_needs_doorbell(c)) doorbell(ep);
}

/* Moves the read on by k bytes of the packet.  At its end (and past its
 * padding) the room is the writer's again: not before, as the writer
 * takes whole lines only, and a small frame is read in two pieces
 * (header, payload).  A writer waiting for the room is answered at once
 * when its request is seen here; else later, when a look finds the ring
 * empty (shm_rx_ready): the fence that makes sure of the request costs a
 * small message's reader ~10 ns, and a writer only asks when the ring
 * is full, which a reader that finds it empty soon after has emptied. */
static void rx_release(slime_ep_t *ep, size_t k) {
    shm_conn_t *c = ep->conn;
    c->rx_left -= k;
    c->rx_got += k;
    if (c->rx_left == 0) k += c->rx_pad;
    c->rx_pos += k;
    c->rx_at = ring_advance(c, c->rx_at, k);
    if (c->rx_left) return;
    atomic_store_explicit(&c->rx->head, c->rx_pos, memory_order_release);
    c->rx_head_unfenced = true;
    if (atomic_load_explicit(&c->rx->want_space, memory_order_relaxed)) rx_answer_writer(ep);
}

/* The receive being read into asked for that (recv_opts_t.cold): a
 * collective's chunk, the rest of whose buffer is still to come. */
static bool rx_cold(const slime_ep_t *ep) {
    return ep->rx.state == RX_PAYLOAD && ep->rx.sink == SINK_RECV && ep->rx.req->cold;
}

/* A packet's lines after its first that the reader asks for as soon as
 * it has the header: each is another trip from the writer's cache, which
 * would otherwise start only when the frame's header has been read and
 * matched.  p2p_bench sendrecv, alternating runs, avg us: 64 B 0.347 ->
 * 0.303, 256 B 0.400 -> 0.382, 1 KiB 0.604 -> 0.583; 8 lines were no
 * better than 4 (the hardware's prefetcher takes a stream on from there). */
#define RX_PREFETCH_LINES 4

/* The header word at our position: the packet's, or what was there
 * before it: 0 (a new ring, or a line the writer cleared), or the last
 * lap's header. */
static uint64_t rx_header(shm_conn_t *c) { return atomic_load_explicit(ring_word(c->rxd, c->rx_at), memory_order_acquire); }

static bool header_is_new(const shm_conn_t *c, uint64_t h) { return h && h >> 32 == shm_stamp(c->rx_pos); }

/* A header there, neither new nor what the writer leaves: the peer
 * scribbled on the ring. */
static bool header_is_foreign(const shm_conn_t *c, uint64_t h) {
    return h && !header_is_new(c, h) && h >> 32 != shm_stamp(c->rx_pos - c->size);
}

/* The bytes of the packet being read still to read, taking the next
 * packet's header when the last is done: 0 while none has come, -1
 * when the ring holds what no writer of ours leaves (the endpoint
 * failed). */
static ssize_t rx_packet(slime_ep_t *ep, shm_conn_t *c) {
    if (c->rx_left) return (ssize_t)c->rx_left;
    uint64_t h = rx_header(c);
    if (!header_is_new(c, h)) {
        if (!header_is_foreign(c, h)) return 0;
        ep_fail(ep, SLIME_ERR_PROTOCOL, "shm: the peer's ring holds a header stamped %" PRIu64 " at line %" PRIu32,
                h >> 32, shm_stamp(c->rx_pos));
        return -1;
    }
    size_t len = (uint32_t)h;
    if (len > c->size - SHM_LINE - SHM_PACKET_HDR) {
        ep_fail(ep, SLIME_ERR_PROTOCOL, "shm: the peer's ring holds a packet of %zu bytes in a ring of %" PRIu64, len,
                c->size);
        return -1;
    }
    /* the packet's next lines are on their way while the frame's
     * header is read and matched */
    size_t more = min_sz((SHM_PACKET_HDR + len - 1) / SHM_LINE, RX_PREFETCH_LINES);
    for (size_t i = 1, at = c->rx_at; i <= more; i++) {
        at = ring_advance(c, at, SHM_LINE);
        __builtin_prefetch(c->rxd + at);
    }
    c->rx_left = len;
    c->rx_pad = packet_slot(c->rx_at, len) - SHM_PACKET_HDR - len;
    c->rx_pos += SHM_PACKET_HDR;
    c->rx_at = ring_advance(c, c->rx_at, SHM_PACKET_HDR);
    return (ssize_t)len;
}

ssize_t shm_read(slime_ep_t *ep, void *dst, size_t n) {
    shm_conn_t *c = ep->conn;
    ssize_t ready = rx_packet(ep, c);
    if (ready < 0) return SLIME_ERR_PROTOCOL;
    /* a packet at a time, handing room back so the writer keeps copying */
    size_t k = min_sz(n, (size_t)ready);
    if (k == 0) return 0;
    size_t at = c->rx_at, first = min_sz(k, (size_t)c->size - at);
    if (n >= STREAM_MIN || rx_cold(ep)) {
        shm_copy_stream(dst, c->rxd + at, first);
        if (k > first) shm_copy_stream((uint8_t *)dst + first, c->rxd, k - first);
    } else {
        memcpy(dst, c->rxd + at, first);
        if (k > first) memcpy((uint8_t *)dst + first, c->rxd, k - first);
    }
    rx_release(ep, k);
    return (ssize_t)k;
}

/* A combining receive reads the ring where the bytes lie, and only then
 * gives them back (combine.c): the same pieces as shm_read, a packet at
 * a time, but never across the wrap. */
size_t shm_rx_peek(slime_ep_t *ep, size_t n, const uint8_t **at) {
    shm_conn_t *c = ep->conn;
    ssize_t ready = rx_packet(ep, c);
    if (ready <= 0) return 0;
    *at = c->rxd + c->rx_at;
    return min_sz(min_sz(n, (size_t)ready), (size_t)c->size - c->rx_at);
}

void shm_rx_consume(slime_ep_t *ep, size_t k) { rx_release(ep, k); }

/* Bytes to read, or what a read will find wrong (and fail on). */
static bool rx_pending(shm_conn_t *c) {
    if (c->rx_left) return true;
    uint64_t h = rx_header(c);
    return header_is_new(c, h) || header_is_foreign(c, h);
}

/* By the writer's count, which it stores after each packet's header: a
 * count no writer leaves only says yes, and the payload is read. */
bool shm_rx_beyond(slime_ep_t *ep, size_t n) {
    shm_conn_t *c = ep->conn;
    return c->hung_up || atomic_load_explicit(&c->rx->tail, memory_order_acquire) - c->rx_got > n;
}

/* A parked payload is no work until something arrives behind it.  Every
 * pass of progress asks (but for a paused endpoint, whose next release
 * looks itself), as does the progress thread before it sleeps: a look
 * that finds nothing answers a writer's request for room that
 * rx_release may not have seen. */
bool shm_rx_ready(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    bool ready = ep->rx.parked ? shm_rx_beyond(ep, ep->rx.left) : rx_pending(c);
    if (!ready && c->rx_head_unfenced) rx_answer_writer(ep);
    return ready;
}

bool shm_has_work(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    if (!c) return false;
    if (shm_rx_ready(ep)) return true;
    /* queued frames and room for them: nobody would ring us for that */
    uint64_t used = c->tx_pos - atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
    return !list_empty(&ep->txq) && packet_fits((size_t)(c->size - used)) > 0;
}

void shm_fd_event(slime_ep_t *ep, uint32_t events) {
    shm_conn_t *c = ep->conn;
    char buf[256];
    ssize_t r;
    while ((r = recv(c->sock, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
    }
    if (r == 0 || (events & (EPOLLHUP | EPOLLERR))) {
        /* what the peer wrote before it died is still worth reading: a
         * parked payload too, which rx_beyond now has drained */
        c->hung_up = true;
        if (!rx_pending(c) || rx_held_back(&ep->rx))
            ep_fail(ep, SLIME_ERR_PEER_LOST, "peer process exited (shm connection hung up)");
    }
}
