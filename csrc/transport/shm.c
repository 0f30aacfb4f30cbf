/* The shm transport, for two contexts on one host.
 *
 * Each connection is a shared segment holding two single-producer rings
 * (one per direction) that carry the stream protocol, plus a SEQPACKET
 * unix socket that passes the segment at the handshake, rings doorbells
 * for a peer that sleeps, and hangs up when the peer process dies.
 * Large two-sided messages are copied in and out of the ring at once by
 * both processes (two cores working); one-sided ops go by single-copy
 * process_vm_readv/writev (CMA), checked against the peer's shared MR
 * table, and fall back to frames when the kernel refuses CMA. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "transport/shm_peermap.h"
#include "transport/sockio.h"
#include "transport/transport.h"

#define SEG_MAGIC 0x534c494d45534547ull
#define SEG_HDR 4096

typedef struct ring {
    _Alignas(64) _Atomic uint64_t tail;       /* producer's */
    _Alignas(64) _Atomic uint64_t head;       /* consumer's */
    _Atomic uint32_t want_space;              /* producer waits for room */
} ring_t;

typedef struct seg_hdr {
    uint64_t magic;
    uint64_t ring_size;
    ring_t ring[2];                           /* [0]: dialer -> acceptor */
} seg_hdr_t;
_Static_assert(sizeof(seg_hdr_t) <= SEG_HDR, "segment header");

/* Unmapped one-sided ops larger than this (DLSLIME_SHM_CMA_MAX) go by the
 * rings, as frames the target's progress thread serves.  Past the
 * last-level cache both ways are bound by memory traffic, and CMA moves
 * three streams (the source, the destination read for ownership, the
 * destination written) where the rings move two (the ring stays cached
 * and its reader streams past the cache): 64 MiB took 5.7-6.1 ms by CMA
 * and 3.6-4.4 ms by the rings, while 16 MiB was level. */
#define CMA_MAX (32u << 20)

typedef struct shm_conn {
    int sock;
    uint8_t *seg;
    size_t seg_len;
    ring_t *tx, *rx;
    uint8_t *txd, *rxd;
    uint64_t size, chunk;
    mr_shared_t *peer;                        /* the peer's MR table */
    int peer_pid;
    bool cma;
    size_t cma_max;                           /* larger unmapped ops go by the rings */
    peermap_t *map;                           /* the peer's shared blocks mapped here */
} shm_conn_t;

static void abstract_name(uint64_t ctx_id, struct sockaddr_un *sa, socklen_t *len) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "dlslime-%016" PRIx64, ctx_id);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

slime_status_t shm_listen(slime_ctx_t *ctx, int *fd_out) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return slime_errorf(SLIME_ERR_SYSTEM, "unix socket: %s", strerror(errno));
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_name(ctx->id, &sa, &sl);
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, 256) < 0) {
        int e = errno;
        close(fd);
        return slime_errorf(SLIME_ERR_SYSTEM, "shm listen: %s", strerror(e));
    }
    *fd_out = fd;
    return SLIME_OK;
}

static int peer_pid_of(int sock) {
    struct ucred cr;
    socklen_t l = sizeof cr;
    return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 ? cr.pid : 0;
}

static void *map_fd(int fd, size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

static shm_conn_t *conn_build(int sock, uint8_t *seg, size_t seg_len, mr_shared_t *peer,
                              bool dialer) {
    shm_conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    seg_hdr_t *h = (seg_hdr_t *)seg;
    c->sock = sock;
    c->seg = seg;
    c->seg_len = seg_len;
    c->size = h->ring_size;
    c->chunk = env_size("DLSLIME_SHM_CHUNK", 256 * 1024);
    uint8_t *d0 = seg + SEG_HDR, *d1 = d0 + h->ring_size;
    c->tx = &h->ring[dialer ? 0 : 1];
    c->rx = &h->ring[dialer ? 1 : 0];
    c->txd = dialer ? d0 : d1;
    c->rxd = dialer ? d1 : d0;
    c->peer = peer;
    c->peer_pid = peer_pid_of(sock);
    c->cma = c->peer_pid > 0 && !env_off("DLSLIME_SHM_CMA");
    c->cma_max = env_size("DLSLIME_SHM_CMA_MAX", CMA_MAX);
    /* DLSLIME_SHM_MAP=0: CMA even for the peer's shared blocks (to compare) */
    c->map = c->cma && !env_off("DLSLIME_SHM_MAP") ? peermap_new(c->peer_pid, peer) : NULL;
    return c;
}

static size_t seg_size(uint64_t ring) { return SEG_HDR + 2 * ring; }

static slime_status_t recv_with_fds(int fd, void *buf, size_t n, int *fds, int maxfds,
                                    uint64_t deadline) {
    for (;;) {
        char cbuf[CMSG_SPACE(sizeof(int) * 2)];
        struct iovec iov = {.iov_base = buf, .iov_len = n};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = sizeof cbuf};
        ssize_t r = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r >= 0) {
            int got = 0;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
                int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                int *in = (int *)CMSG_DATA(cm);
                for (int i = 0; i < k; i++) {
                    if (got < maxfds) fds[got++] = in[i];
                    else close(in[i]);
                }
            }
            if ((size_t)r != n || got != maxfds) {
                for (int i = 0; i < got; i++) close(fds[i]);
                if (r == 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: peer closed the connection");
                return slime_errorf(SLIME_ERR_PROTOCOL, "handshake: malformed shm message (%zd bytes, %d fds)", r, got);
            }
            return SLIME_OK;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: %s", strerror(errno));
        int w = sock_wait(fd, POLLIN, deadline);
        if (w == 0) return slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out waiting for the peer's reply");
        if (w < 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed");
    }
}

static slime_status_t send_with_fds(int sock, const void *buf, size_t n, const int *fds, int nfds,
                                    uint64_t deadline) {
    char cbuf[CMSG_SPACE(sizeof(int) * 2)];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        msg.msg_control = cbuf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    return sock_sendmsg_all(sock, &msg, deadline);
}

static slime_status_t shm_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline,
                               void **conn, int *fd_out, wire_welcome_t *w) {
    if (!(peer->flags & ADDR_HAS_SHM) || !address_same_host(&ctx->addr, peer))
        return slime_errorf(SLIME_ERR_UNSUPPORTED,
                            "shm: peer %016" PRIx64 " is not on this host (or has no shm listener)",
                            peer->ctx_id);
    slime_status_t st;
    uint8_t *seg = NULL;
    mr_shared_t *pt = NULL;
    int segfd = -1, peerfd = -1;
    /* 4 MiB: room for one side to run ahead while the other is off its
     * core (2 cores, shared), in 256 KiB chunks that each side publishes
     * as it goes; measured sendrecv 16 MiB 4.7 -> 7.3 GB/s, 64 MiB 5.1 ->
     * 6.3 (1 MiB ring, 128 KiB chunks before) */
    uint64_t ring = env_size("DLSLIME_SHM_RING", 4u << 20);
    size_t len = seg_size(ring);
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0) return slime_errorf(SLIME_ERR_SYSTEM, "unix socket: %s", strerror(errno));
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_name(peer->ctx_id, &sa, &sl);
    if (connect(sock, (struct sockaddr *)&sa, sl) < 0) {
        st = slime_errorf(SLIME_ERR_PEER_LOST, "shm connect to %016" PRIx64 ": %s", peer->ctx_id,
                          strerror(errno));
        goto fail;
    }
    sock_set_nonblock(sock);
    segfd = memfd_create("dlslime-ring", MFD_CLOEXEC);
    if (segfd < 0 || ftruncate(segfd, (off_t)len) < 0 || !(seg = map_fd(segfd, len))) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "shm segment of %zu bytes: %s", len, strerror(errno));
        goto fail;
    }
    seg_hdr_t *h = (seg_hdr_t *)seg;
    h->magic = SEG_MAGIC;
    h->ring_size = ring;
    wire_hello_t hello;
    hello_fill(ctx, WIRE_TRANSPORT_SHM, &hello);
    int fds[2] = {segfd, ctx->mr_fd};
    if ((st = send_with_fds(sock, &hello, sizeof hello, fds, 2, deadline)) != SLIME_OK) goto fail;
    /* a refusal comes without an fd */
    char wbuf[sizeof *w];
    char cbuf[CMSG_SPACE(sizeof(int))];
    for (;;) {
        struct iovec iov = {.iov_base = wbuf, .iov_len = sizeof wbuf};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = sizeof cbuf};
        ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r >= 0) {
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(&peerfd, CMSG_DATA(cm), sizeof(int));
            if (r != (ssize_t)sizeof *w) {
                st = r == 0 ? slime_errorf(SLIME_ERR_PEER_LOST, "handshake: peer closed the connection")
                            : slime_errorf(SLIME_ERR_PROTOCOL, "handshake: malformed welcome");
                goto fail;
            }
            break;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN) { st = slime_errorf(SLIME_ERR_PEER_LOST, "handshake: %s", strerror(errno)); goto fail; }
        int wr = sock_wait(sock, POLLIN, deadline);
        if (wr == 0) { st = slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out waiting for the peer's reply"); goto fail; }
        if (wr < 0) { st = slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed"); goto fail; }
    }
    memcpy(w, wbuf, sizeof *w);
    if (w->magic == WIRE_WELCOME_MAGIC && w->verdict == WELCOME_OK) {
        if (peerfd < 0 || !(pt = map_fd(peerfd, sizeof(mr_shared_t)))) {
            st = slime_errorf(SLIME_ERR_PROTOCOL, "handshake: peer sent no usable MR table");
            goto fail;
        }
        if (!(*conn = conn_build(sock, seg, len, pt, true))) { st = slime_errorf(SLIME_ERR_NOMEM, "shm conn"); goto fail; }
        seg = NULL;
        pt = NULL;
    } else {
        *conn = NULL; /* the caller reads the verdict */
    }
    if (peerfd >= 0) close(peerfd);
    close(segfd);
    if (seg) munmap(seg, len);
    *fd_out = sock;
    if (!*conn) { close(sock); *fd_out = -1; }
    return SLIME_OK;
fail:
    if (pt) munmap(pt, sizeof(mr_shared_t));
    if (peerfd >= 0) close(peerfd);
    if (seg) munmap(seg, len);
    if (segfd >= 0) close(segfd);
    close(sock);
    return st;
}

static int shm_read_hello(slime_ctx_t *ctx, pending_conn_t *pc) {
    (void)ctx;
    slime_status_t st = recv_with_fds(pc->fd, &pc->hello, sizeof pc->hello, pc->xfd, 2, 0);
    if (st == SLIME_ERR_TIMEOUT) return 0; /* nothing yet: deadline 0 polls once */
    if (st != SLIME_OK || pc->hello.magic != WIRE_HELLO_MAGIC) return -1;
    pc->got = sizeof pc->hello;
    pc->peer_pid = (uint32_t)peer_pid_of(pc->fd);
    return 1;
}

static slime_status_t shm_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc,
                                       const wire_welcome_t *w, void **conn) {
    if (!conn) return send_with_fds(pc->fd, w, sizeof *w, NULL, 0, now_ns() + 1000000000ull);
    struct stat_len { size_t len; } sz;
    off_t end = lseek(pc->xfd[0], 0, SEEK_END);
    sz.len = end > 0 ? (size_t)end : 0;
    uint8_t *seg = sz.len > SEG_HDR ? map_fd(pc->xfd[0], sz.len) : NULL;
    mr_shared_t *pt = map_fd(pc->xfd[1], sizeof(mr_shared_t));
    seg_hdr_t *h = (seg_hdr_t *)seg;
    if (!seg || !pt || h->magic != SEG_MAGIC || seg_size(h->ring_size) != sz.len ||
        pt->magic != MR_TABLE_MAGIC) {
        if (seg) munmap(seg, sz.len);
        if (pt) munmap(pt, sizeof(mr_shared_t));
        return slime_errorf(SLIME_ERR_PROTOCOL, "shm handshake: bad segment from peer");
    }
    slime_status_t st = send_with_fds(pc->fd, w, sizeof *w, &ctx->mr_fd, 1, now_ns() + 1000000000ull);
    if (st == SLIME_OK && !(*conn = conn_build(pc->fd, seg, sz.len, pt, false)))
        st = slime_errorf(SLIME_ERR_NOMEM, "shm conn");
    if (st != SLIME_OK) {
        munmap(seg, sz.len);
        munmap(pt, sizeof(mr_shared_t));
    }
    return st;
}

static void doorbell(shm_conn_t *c) {
    /* a full socket queue already guarantees a wake-up */
    char b = 1;
    (void)send(c->sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Nobody of the peer's polls its rings now, nor will soon. */
static bool peer_needs_doorbell(shm_conn_t *c) {
    return atomic_load(&c->peer->polling) == 0 && now_ns() > atomic_load(&c->peer->grace_until);
}

static void ring_copy_in(shm_conn_t *c, uint64_t pos, const uint8_t *src, size_t n) {
    size_t at = (size_t)(pos % c->size), first = min_sz(n, (size_t)c->size - at);
    memcpy(c->txd + at, src, first);
    if (n > first) memcpy(c->txd, src + first, n - first);
}

static ssize_t shm_writev(slime_ep_t *ep, const struct iovec *iov, int n) {
    shm_conn_t *c = ep->conn;
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&c->tx->head, memory_order_acquire);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            size_t room = (size_t)(c->size - (tail - head));
            if (room == 0) {
                /* ask for a doorbell, then look again: the reader may
                 * have freed room before it could see the request */
                atomic_store_explicit(&c->tx->want_space, 1, memory_order_seq_cst);
                head = atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
                room = (size_t)(c->size - (tail - head));
                if (room == 0) goto done;
            }
            size_t k = min_sz(min_sz(left, room), (size_t)c->chunk);
            ring_copy_in(c, tail, p, k);
            tail += k;
            p += k;
            left -= k;
            total += k;
            /* publish each chunk so the reader copies out while we copy in */
            atomic_store_explicit(&c->tx->tail, tail, memory_order_release);
        }
    }
done:
    if (total) {
        atomic_thread_fence(memory_order_seq_cst);
        if (peer_needs_doorbell(c)) doorbell(c);
    }
    return (ssize_t)total;
}

/* memcpy with non-temporal stores: the destination's lines are not read
 * first (a plain store to a line not in cache fetches it from memory),
 * nor kept in cache.  Measured here, a 64 MiB copy runs at 12 GB/s with
 * memcpy in 128 KiB pieces and 14 GB/s so; two threads at 14 and 20. */
static void copy_stream(uint8_t *dst, const uint8_t *src, size_t n) {
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

/* Moves the read head to head (the bytes before it are read): the room
 * is the writer's again, and a writer waiting for it gets a doorbell. */
static void rx_release(shm_conn_t *c, uint64_t head) {
    atomic_store_explicit(&c->rx->head, head, memory_order_seq_cst);
    if (atomic_load_explicit(&c->rx->want_space, memory_order_seq_cst)) {
        atomic_store(&c->rx->want_space, 0);
        if (peer_needs_doorbell(c)) doorbell(c);
    }
}

/* The receive being read into asked for that (recv_opts_t.cold): a
 * collective's chunk, the rest of whose buffer is still to come. */
static bool rx_cold(const slime_ep_t *ep) {
    return ep->rx.state == RX_PAYLOAD && ep->rx.sink == SINK_RECV && ep->rx.req->cold;
}

static ssize_t shm_read(slime_ep_t *ep, void *dst, size_t n) {
    shm_conn_t *c = ep->conn;
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_acquire);
    /* hand room back chunk by chunk so the writer keeps copying in */
    size_t k = min_sz(min_sz(n, (size_t)(tail - head)), (size_t)c->chunk);
    if (k == 0) return 0;
    size_t at = (size_t)(head % c->size), first = min_sz(k, (size_t)c->size - at);
    if (n >= STREAM_MIN || rx_cold(ep)) {
        copy_stream(dst, c->rxd + at, first);
        if (k > first) copy_stream((uint8_t *)dst + first, c->rxd, k - first);
    } else {
        memcpy(dst, c->rxd + at, first);
        if (k > first) memcpy((uint8_t *)dst + first, c->rxd, k - first);
    }
    rx_release(c, head + k);
    return (ssize_t)k;
}

/* A combining receive reads the ring where the bytes lie, and only then
 * gives them back (combine.c): the same pieces as shm_read, a chunk at a
 * time so the writer keeps copying in, but never across the wrap. */
static size_t shm_rx_peek(slime_ep_t *ep, size_t n, const uint8_t **at) {
    shm_conn_t *c = ep->conn;
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_acquire);
    size_t off = (size_t)(head % c->size);
    *at = c->rxd + off;
    return min_sz(min_sz(min_sz(n, (size_t)(tail - head)), (size_t)c->chunk), (size_t)c->size - off);
}

static void shm_rx_consume(slime_ep_t *ep, size_t k) {
    shm_conn_t *c = ep->conn;
    rx_release(c, atomic_load_explicit(&c->rx->head, memory_order_relaxed) + k);
}

static bool rx_pending(shm_conn_t *c) {
    return atomic_load_explicit(&c->rx->tail, memory_order_acquire) !=
           atomic_load_explicit(&c->rx->head, memory_order_relaxed);
}

bool shm_has_work(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    if (!c) return false;
    if (rx_pending(c)) return true;
    /* queued frames and room for them: nobody would ring us for that */
    uint64_t used = atomic_load_explicit(&c->tx->tail, memory_order_relaxed) -
                    atomic_load_explicit(&c->tx->head, memory_order_seq_cst);
    return !list_empty(&ep->txq) && used < c->size;
}

static bool shm_rx_ready(slime_ep_t *ep) { return rx_pending(ep->conn); }

static void shm_fd_event(slime_ep_t *ep, uint32_t events) {
    shm_conn_t *c = ep->conn;
    char buf[256];
    ssize_t r;
    while ((r = recv(c->sock, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
    }
    if (r == 0 || (events & (EPOLLHUP | EPOLLERR))) {
        /* what the peer wrote before it died is still worth reading */
        if (!rx_pending(c) || ep->rx.paused)
            ep_fail(ep, SLIME_ERR_PEER_LOST, "peer process exited (shm connection hung up)");
    }
}

/* One-sided ops are copied in pieces of this size by the context's copy
 * team (core/team.c): one core alone copies at half the speed of two,
 * and small pieces let the caller take most of them while a helper is
 * still waking up.  Below the team minimum the caller copies alone, as
 * waking a helper costs more than it saves: a mapped block is copied
 * with memcpy, where a helper pays only from 2 MiB; CMA of a registered
 * region, which is on huge pages (core/hugepages.c), ran one core at
 * 27 GB/s, and 1-2 MiB ops took 47-49 / 87-91 us alone against 57-76 /
 * 99-103 us with the team (rdma_bench, measured alternately). */
#define RMA_PIECE (512u << 10)
#define MAPPED_TEAM_MIN (2u << 20)
#define CMA_TEAM_MIN (4u << 20)

/* A share of a one-sided op, copied by whichever team thread claims it:
 * with memcpy where the peer's block is mapped here (shm_peermap.c),
 * else by CMA.  The op's range is pinned in the peer's table meanwhile. */
typedef struct rma_job {
    shm_conn_t *c;
    slime_req_t *req;
    size_t base;               /* offset in req of the job's first byte */
    uint64_t raddr;            /* where that byte is in the peer */
    uint8_t *mapped;           /* ...and here, when mapped; else NULL */
    _Atomic int err;           /* errno of the first failed copy, or 0 */
} rma_job_t;

static slime_status_t rma_piece(void *arg, size_t off, size_t len) {
    rma_job_t *j = arg;
    slime_req_t *req = j->req;
    uint8_t *local = (uint8_t *)req->buf + j->base + off;
    if (j->mapped) {
        uint8_t *dst = req->is_write ? j->mapped + off : local;
        const uint8_t *src = req->is_write ? local : j->mapped + off;
        /* an op past the cache (the size the rings take over at for CMA)
         * streams its stores, as the rings' reader does: two streams of
         * memory traffic instead of three */
        if (req->len > CMA_MAX) copy_stream(dst, src, len);
        else memcpy(dst, src, len);
        return SLIME_OK;
    }
    uint64_t raddr = j->raddr + off;
    while (len) {
        struct iovec l = {.iov_base = local, .iov_len = len};
        struct iovec r = {.iov_base = (void *)(uintptr_t)raddr, .iov_len = len};
        ssize_t n = req->is_write ? process_vm_writev(j->c->peer_pid, &l, 1, &r, 1, 0)
                                  : process_vm_readv(j->c->peer_pid, &l, 1, &r, 1, 0);
        if (n <= 0) { /* 0: nothing moved, which a valid range never gives */
            int first = 0;
            atomic_compare_exchange_strong(&j->err, &first, n < 0 ? errno : EFAULT);
            return SLIME_ERR_ACCESS;
        }
        local += n;
        raddr += (uint64_t)n;
        len -= (size_t)n;
    }
    return SLIME_OK;
}

/* A batch of small one-sided ops costs a system call each, and the
 * call's fixed part (finding the peer's mm, importing the iovecs) is
 * most of a small op's time.  So the small CMA ops queued right behind
 * the head of the queue in its direction are copied with it in one
 * process_vm_readv/writev; each copied whole is marked done, which
 * leaves shm_rma only its completion.  An op that does not fit (large,
 * mapped, refused by the region table) ends the run; a call that fails
 * or copies short leaves the rest to the one-by-one path, which reports
 * errors op by op (a partial copy never splits an iovec). */
#define COALESCE_OP_MAX (64u << 10)
#define COALESCE_OPS 256 /* iovecs a call, under IOV_MAX */

static void rma_coalesce(slime_ep_t *ep, slime_req_t *head) {
    shm_conn_t *c = ep->conn;
    struct iovec l[COALESCE_OPS], r[COALESCE_OPS];
    slime_req_t *reqs[COALESCE_OPS];
    size_t n = 0;
    unsigned access = head->is_write ? SLIME_ACCESS_REMOTE_WRITE : SLIME_ACCESS_REMOTE_READ;
    for (slime_list_t *it = &head->qlink; it != &ep->rmaq && n < COALESCE_OPS; it = it->next) {
        slime_req_t *q = container_of(it, slime_req_t, qlink);
        uint64_t raddr;
        char why[160];
        if (q->done || q->len > COALESCE_OP_MAX || q->is_write != head->is_write) break;
        if (mr_table_acquire(c->peer, q->r_handle, q->r_rkey, q->r_off, q->len, access, &raddr, why,
                             sizeof why) != SLIME_OK)
            break;
        if (peermap_lookup(c->map, &c->peer->slots[(uint32_t)(q->r_handle >> 32)], raddr)) {
            mr_table_release(c->peer, q->r_handle); /* memcpy serves it */
            break;
        }
        l[n] = (struct iovec){.iov_base = q->buf, .iov_len = q->len};
        r[n] = (struct iovec){.iov_base = (void *)(uintptr_t)raddr, .iov_len = q->len};
        reqs[n++] = q;
    }
    if (n >= 2) {
        ssize_t got = head->is_write ? process_vm_writev(c->peer_pid, l, n, r, n, 0)
                                     : process_vm_readv(c->peer_pid, l, n, r, n, 0);
        for (size_t i = 0; i < n && got >= (ssize_t)reqs[i]->len; i++) {
            reqs[i]->done = reqs[i]->len;
            got -= (ssize_t)reqs[i]->len;
        }
    }
    for (size_t i = 0; i < n; i++) mr_table_release(c->peer, reqs[i]->r_handle);
}

static slime_status_t shm_rma(slime_ep_t *ep, slime_req_t *req, size_t max) {
    shm_conn_t *c = ep->conn;
    if (!c->cma) return SLIME_ERR_UNSUPPORTED;
    /* the head of the queue (which rma is always given) with ops behind it */
    if (req->done == 0 && req->len <= COALESCE_OP_MAX && req->qlink.next != &ep->rmaq)
        rma_coalesce(ep, req);
    while (req->done < req->len && max) {
        size_t k = min_sz(req->len - req->done, max);
        rma_job_t j = {.c = c, .req = req, .base = req->done};
        char why[160];
        slime_status_t st = mr_table_acquire(c->peer, req->r_handle, req->r_rkey, req->r_off + req->done, k,
                                             req->is_write ? SLIME_ACCESS_REMOTE_WRITE : SLIME_ACCESS_REMOTE_READ,
                                             &j.raddr, why, sizeof why);
        if (st != SLIME_OK) {
            req_complete(req, st, "remote region: %s", why);
            return st;
        }
        j.mapped = peermap_lookup(c->map, &c->peer->slots[(uint32_t)(req->r_handle >> 32)], j.raddr);
        if (!j.mapped && req->done == 0 && req->len > c->cma_max) {
            mr_table_release(c->peer, req->r_handle);
            return SLIME_ERR_UNSUPPORTED; /* by the rings, see CMA_MAX */
        }
        st = team_run(ep->ctx, rma_piece, &j, k, k < (j.mapped ? MAPPED_TEAM_MIN : CMA_TEAM_MIN) ? k : RMA_PIECE);
        mr_table_release(c->peer, req->r_handle);
        if (st == SLIME_OK) {
            req->done += k;
            max -= k;
            continue;
        }
        int err = atomic_load(&j.err);
        if (err == EPERM || err == ENOSYS || err == EACCES) {
            c->cma = false; /* the frames path will serve it, from the start */
            return SLIME_ERR_UNSUPPORTED;
        }
        if (err == ESRCH) {
            ep_fail(ep, SLIME_ERR_PEER_LOST, "peer process is gone");
            return SLIME_ERR_PEER_LOST;
        }
        req_complete(req, SLIME_ERR_ACCESS, "cross-memory %s failed: %s",
                     req->is_write ? "write" : "read", strerror(err));
        return SLIME_ERR_ACCESS;
    }
    return req->done < req->len ? SLIME_INPROGRESS : SLIME_OK;
}

static void shm_close(slime_ep_t *ep) {
    shm_conn_t *c = ep->conn;
    if (!c) return;
    close(c->sock);
    munmap(c->seg, c->seg_len);
    peermap_free(c->map);
    munmap(c->peer, sizeof(mr_shared_t));
    free(c);
    ep->conn = NULL;
}

const transport_ops_t slime_shm_transport = {
    .name = "shm",
    .wire = WIRE_TRANSPORT_SHM,
    .dial = shm_dial,
    .read_hello = shm_read_hello,
    .send_welcome = shm_send_welcome,
    .read = shm_read,
    .writev = shm_writev,
    .rx_ready = shm_rx_ready,
    .fd_event = shm_fd_event,
    .rma = shm_rma,
    .close = shm_close,
    .rx_peek = shm_rx_peek,
    .rx_consume = shm_rx_consume,
};
