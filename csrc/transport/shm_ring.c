/* The frame stream of a shm connection: two single-producer rings in the
 * shared segment, one per direction.  Each side copies in (or out) a
 * chunk at a time and publishes it at once, so the other side copies
 * while it goes on; a side that sleeps is woken by a doorbell byte on the
 * socket, sent only when no thread of the peer polls (mr_shared_t). */
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

/* Copies n bytes (at most the ring's size) in at the tail's offset, and
 * moves the offset on. */
static void ring_copy_in(shm_conn_t *c, const uint8_t *src, size_t n) {
    size_t at = c->tx_at, first = min_sz(n, (size_t)c->size - at);
    memcpy(c->txd + at, src, first);
    if (n > first) memcpy(c->txd, src + first, n - first);
    c->tx_at = ring_advance(c, at, n);
}

/* Nobody of the peer's polls its rings now, nor will soon: ring it.
 * After the tail's store, which the fence orders before the look. */
static void ring_if_asleep(slime_ep_t *ep) {
    atomic_thread_fence(memory_order_seq_cst);
    if (peer_needs_doorbell(ep->conn)) doorbell(ep);
}

/* The room after tail, by the head as last read, which is read again
 * only when that leaves less than need: the reader moves the head with
 * every message, so each fresh read is a cache miss. */
static size_t tx_room(shm_conn_t *c, uint64_t tail, size_t need) {
    size_t room = (size_t)(c->size - (tail - c->tx_head_seen));
    if (room >= need) return room;
    c->tx_head_seen = atomic_load_explicit(&c->tx->head, memory_order_acquire);
    return (size_t)(c->size - (tail - c->tx_head_seen));
}

/* The common case, a small frame (a header and its payload) with room
 * for all of it: copied in and published at once, with none of the
 * chunking below.  Total bytes, or 0 when it does not fit so. */
static size_t write_whole(shm_conn_t *c, const struct iovec *iov, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    if (total == 0 || total > c->chunk || total > tx_room(c, c->tx_tail, total)) return 0;
    for (int i = 0; i < n; i++) ring_copy_in(c, iov[i].iov_base, iov[i].iov_len);
    c->tx_tail += total;
    atomic_store_explicit(&c->tx->tail, c->tx_tail, memory_order_release);
    return total;
}

ssize_t shm_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    shm_conn_t *c = ep->conn;
    size_t whole = write_whole(c, iov, n);
    if (whole) {
        ring_if_asleep(ep);
        return (ssize_t)whole;
    }
    uint64_t tail = c->tx_tail, published = tail;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            size_t room = tx_room(c, tail, min_sz(left, (size_t)c->chunk));
            if (room == 0) {
                atomic_store_explicit(&c->tx->tail, tail, memory_order_release);
                published = tail;
                /* ask for a doorbell, then look again: the reader may
                 * have freed room before it could see the request */
                atomic_store_explicit(&c->tx->want_space, 1, memory_order_seq_cst);
                c->tx_head_seen = atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
                room = (size_t)(c->size - (tail - c->tx_head_seen));
                if (room == 0) goto done;
            }
            size_t k = min_sz(min_sz(left, room), (size_t)c->chunk);
            ring_copy_in(c, p, k);
            tail += k;
            p += k;
            left -= k;
            total += k;
            /* publish each chunk so the reader copies out while we copy
             * in; a frame's small pieces (header, payload) go at once, so
             * the reader never finds a header without its payload */
            if (tail - published >= c->chunk) {
                atomic_store_explicit(&c->tx->tail, tail, memory_order_release);
                published = tail;
            }
        }
    }
done:
    if (tail != published) atomic_store_explicit(&c->tx->tail, tail, memory_order_release);
    c->tx_tail = tail;
    if (total) ring_if_asleep(ep);
    return (ssize_t)total;
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
 * before anyone reads it anyway (the L3 here is 32 MiB, shared by both
 * processes), and skipping the line fills leaves the memory bus to the
 * sender's reads.  Measured with p2p_bench sendrecv (medians of 5,
 * loaded 2-core machine): 64 MiB 5.5 -> 6.8-7.0 GB/s, 16 MiB 5.9 ->
 * 6.4-7.1 GB/s; limits of 2, 4 and 8 MiB were within noise of each other
 * there, but 1 MiB made a cache-hot 1 MiB torch ping-pong 3x slower.
 * The tail of a message stays in cache for whoever reads it next. */
#define STREAM_MIN (4u << 20)

/* Moves the read head on by k bytes (read): the room is the writer's
 * again, and a writer waiting for it gets a doorbell. */
static void rx_release(slime_ep_t *ep, size_t k) {
    shm_conn_t *c = ep->conn;
    c->rx_head += k;
    c->rx_at = ring_advance(c, c->rx_at, k);
    atomic_store_explicit(&c->rx->head, c->rx_head, memory_order_seq_cst);
    if (atomic_load_explicit(&c->rx->want_space, memory_order_seq_cst)) {
        atomic_store(&c->rx->want_space, 0);
        if (peer_needs_doorbell(c)) doorbell(ep);
    }
}

/* The receive being read into asked for that (recv_opts_t.cold): a
 * collective's chunk, the rest of whose buffer is still to come. */
static bool rx_cold(const slime_ep_t *ep) {
    return ep->rx.state == RX_PAYLOAD && ep->rx.sink == SINK_RECV && ep->rx.req->cold;
}

/* The bytes waiting after the read head.  The tail lives in the segment
 * the peer writes: more bytes than the ring holds is a tail no writer
 * leaves, and the connection fails rather than read the ring round and
 * round for ever. */
static bool rx_waiting(slime_ep_t *ep, shm_conn_t *c, uint64_t *waiting) {
    *waiting = atomic_load_explicit(&c->rx->tail, memory_order_acquire) - c->rx_head;
    if (*waiting <= c->size) return true;
    ep_fail(ep, SLIME_ERR_PROTOCOL, "shm: the peer's ring says %" PRIu64 " bytes wait in a ring of %" PRIu64,
            *waiting, c->size);
    return false;
}

ssize_t shm_read(slime_ep_t *ep, void *dst, size_t n) {
    shm_conn_t *c = ep->conn;
    uint64_t waiting;
    if (!rx_waiting(ep, c, &waiting)) return SLIME_ERR_PROTOCOL;
    /* hand room back chunk by chunk so the writer keeps copying in */
    size_t k = min_sz(min_sz(n, (size_t)waiting), (size_t)c->chunk);
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
 * gives them back (combine.c): the same pieces as shm_read, a chunk at a
 * time so the writer keeps copying in, but never across the wrap. */
size_t shm_rx_peek(slime_ep_t *ep, size_t n, const uint8_t **at) {
    shm_conn_t *c = ep->conn;
    uint64_t waiting;
    if (!rx_waiting(ep, c, &waiting)) return 0;
    size_t off = c->rx_at;
    *at = c->rxd + off;
    return min_sz(min_sz(min_sz(n, (size_t)waiting), (size_t)c->chunk), (size_t)c->size - off);
}

void shm_rx_consume(slime_ep_t *ep, size_t k) { rx_release(ep, k); }

/* Unchecked: a count no writer leaves only makes us read, and the read
 * (rx_waiting) fails the connection. */
static uint64_t rx_count(shm_conn_t *c) {
    return atomic_load_explicit(&c->rx->tail, memory_order_acquire) - c->rx_head;
}

static bool rx_pending(shm_conn_t *c) { return rx_count(c) != 0; }

bool shm_rx_beyond(slime_ep_t *ep, size_t n) {
    shm_conn_t *c = ep->conn;
    return c->hung_up || rx_count(c) > n;
}

/* A parked payload is no work until something arrives behind it. */
bool shm_rx_ready(slime_ep_t *ep) {
    return ep->rx.parked ? shm_rx_beyond(ep, ep->rx.left) : rx_pending(ep->conn);
}

bool shm_has_work(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    if (!c) return false;
    if (shm_rx_ready(ep)) return true;
    /* queued frames and room for them: nobody would ring us for that */
    uint64_t used = c->tx_tail - atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
    return !list_empty(&ep->txq) && used < c->size;
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
