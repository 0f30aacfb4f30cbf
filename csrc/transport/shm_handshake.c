/* How a shm connection comes up.  The dialer creates the segment of the
 * rings (a memfd) and connects to the acceptor's abstract unix socket,
 * named after its context id; the hello carries the segment's fd and the
 * dialer's MR table fd, the welcome the acceptor's MR table fd (none with
 * a refusal).  The socket stays: doorbells, and a hang-up when the peer
 * process dies.  What comes from the peer is untrusted: its memfds are
 * mapped only if sealed against resizing (core/memfd.c), and the sizes in
 * its segment's header are read once, bounded, then kept privately. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport/shm_internal.h"
#include "transport/sockio.h"

static void abstract_name(uint64_t ctx_id, struct sockaddr_un *sa, socklen_t *len) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "dlslime-%016" PRIx64, ctx_id);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

slime_status_t shm_listen(uint64_t ctx_id, int *fd_out) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return slime_errorf(SLIME_ERR_SYSTEM, "unix socket: %s", strerror(errno));
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_name(ctx_id, &sa, &sl);
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, 256) < 0) {
        int e = errno;
        close(fd);
        return slime_errorf(SLIME_ERR_SYSTEM, "shm listen: %s", strerror(e));
    }
    *fd_out = fd;
    return SLIME_OK;
}

/* One message of n bytes with between minfds and maxfds fds (extra ones
 * are closed) by the deadline; a deadline of 0 looks once, and
 * SLIME_ERR_TIMEOUT then says nothing is there yet. */
static slime_status_t recv_with_fds(int fd, void *buf, size_t n, int *fds, int minfds, int maxfds,
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
            if ((size_t)r != n || got < minfds) {
                for (int i = 0; i < got; i++) {
                    close(fds[i]);
                    fds[i] = -1; /* the caller closes what it holds */
                }
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

/* A connected, non-blocking socket to the peer's listener. */
static slime_status_t dial_socket(uint64_t peer_id, int *out) {
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0) return slime_errorf(SLIME_ERR_SYSTEM, "unix socket: %s", strerror(errno));
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_name(peer_id, &sa, &sl);
    if (connect(sock, (struct sockaddr *)&sa, sl) < 0) {
        slime_status_t st = slime_errorf(SLIME_ERR_PEER_LOST, "shm connect to %016" PRIx64 ": %s", peer_id,
                                         strerror(errno));
        close(sock);
        return st;
    }
    sock_set_nonblock(sock);
    *out = sock;
    return SLIME_OK;
}

/* The segment of the two rings, in a sealed memfd the acceptor maps too. */
static slime_status_t seg_create(uint64_t ring, int *fd_out, uint8_t **out) {
    size_t len = shm_seg_size(ring);
    int fd;
    slime_status_t st = memfd_sealed("dlslime-ring", len, &fd);
    if (st != SLIME_OK) return st;
    uint8_t *seg = shm_map_ring(fd, len, true);
    if (!seg) {
        st = slime_errorf(SLIME_ERR_SYSTEM, "shm segment of %zu bytes: %s", len, strerror(errno));
        close(fd);
        return st;
    }
    seg_hdr_t *h = (seg_hdr_t *)seg;
    h->magic = SEG_MAGIC;
    h->ring_size = ring;
    *fd_out = fd;
    *out = seg;
    return SLIME_OK;
}

/* The peer's MR table from the fd it passed: a sealed memfd large enough
 * for the table, with the table's magic; NULL, and why, otherwise. */
static mr_shared_t *peer_table_map(int fd, char *why, size_t whylen) {
    char fdwhy[48];
    size_t len;
    mr_shared_t *pt = NULL;
    if (fd < 0) snprintf(why, whylen, "no MR table");
    else if (!memfd_check(fd, &len, fdwhy, sizeof fdwhy)) snprintf(why, whylen, "MR table: %s", fdwhy);
    else if (len < sizeof *pt) snprintf(why, whylen, "MR table of %zu bytes", len);
    else if (!(pt = shm_map(fd, sizeof *pt))) snprintf(why, whylen, "MR table: mmap: %s", strerror(errno));
    else if (read_once_u64(&pt->magic) != MR_TABLE_MAGIC) {
        snprintf(why, whylen, "MR table has a bad magic");
        munmap(pt, sizeof *pt);
        pt = NULL;
    }
    return pt;
}

/* The dialer's segment: a sealed memfd whose header's ring size (read
 * once, into *ring) fits it exactly; NULL, and why, otherwise. */
static uint8_t *peer_segment_map(int fd, size_t *len, uint64_t *ring, char *why, size_t whylen) {
    char fdwhy[48];
    if (!memfd_check(fd, len, fdwhy, sizeof fdwhy)) {
        snprintf(why, whylen, "ring segment: %s", fdwhy);
        return NULL;
    }
    if (*len < shm_seg_size(RING_MIN) || *len > shm_seg_size(RING_MAX)) {
        snprintf(why, whylen, "ring segment of %zu bytes", *len);
        return NULL;
    }
    uint8_t *seg = shm_map_ring(fd, *len, false);
    if (!seg) {
        snprintf(why, whylen, "ring segment: mmap: %s", strerror(errno));
        return NULL;
    }
    seg_hdr_t *h = (seg_hdr_t *)seg;
    uint64_t magic = read_once_u64(&h->magic), r = read_once_u64(&h->ring_size);
    /* bounded first, so the size computed from it cannot wrap */
    if (magic != SEG_MAGIC || r < RING_MIN || r > RING_MAX || r % SHM_LINE || shm_seg_size(r) != *len) {
        snprintf(why, whylen, magic != SEG_MAGIC ? "ring segment has a bad magic" : "ring size %" PRIu64 " for %zu bytes",
                 r, *len);
        munmap(seg, *len);
        return NULL;
    }
    *ring = r;
    return seg;
}

/* The dialer's connection, once welcomed with the acceptor's MR table. */
static slime_status_t dialer_conn(int sock, uint8_t *seg, size_t len, uint64_t ring, int peerfd, void **conn) {
    char why[80];
    mr_shared_t *pt = peer_table_map(peerfd, why, sizeof why);
    if (!pt) return slime_errorf(SLIME_ERR_PROTOCOL, "shm handshake: the acceptor's %s", why);
    if (!(*conn = shm_conn_new(sock, seg, len, ring, pt, true))) {
        munmap(pt, sizeof(mr_shared_t));
        return slime_errorf(SLIME_ERR_NOMEM, "shm conn");
    }
    return SLIME_OK;
}

slime_status_t shm_dial(slime_ctx_t *ctx, const wire_addr_t *peer, uint64_t deadline, void **conn,
                        int *fd_out, wire_welcome_t *w) {
    *conn = NULL;
    *fd_out = -1;
    /* 512 KiB: eight of the 64 KiB pieces each side publishes as it goes
     * (DLSLIME_SHM_CHUNK), room enough to run ahead, and few enough lines
     * that a message's trip stays in cache: every message moves on
     * through the ring, so a large ring cycles all of itself through the
     * caches, evicting the data and the code around the transfer.  4 MiB
     * -> 512 KiB, alternating runs: p2p_bench sendrecv (avg us) 1 MiB 92
     * -> 85, 4 MiB 385 -> 360, allreduce 256 KiB 43 -> 33, 1 MiB 173 ->
     * 155; through torch, 2 ranks, all_reduce 1 MiB 216 -> 191, send/recv
     * 1 MiB 104 -> 91; 4 ranks on 2 cores level within the noise (+-10%);
     * streamed 32 MiB messages level or faster.  256 KiB slowed a 1 MiB
     * broadcast through torch by a fifth. */
    uint64_t ring = env_size("DLSLIME_SHM_RING", 512u << 10);
    if (ring < RING_MIN || ring > RING_MAX)
        return slime_errorf(SLIME_ERR_INVAL, "DLSLIME_SHM_RING=%" PRIu64 ": a ring is %llu bytes to %llu", ring, RING_MIN,
                            RING_MAX);
    /* whole pairs of lines: packets start on lines, and the larger ones
     * on pairs (shm_ring.c) */
    ring &= ~(uint64_t)(2 * SHM_LINE - 1);
    size_t len = shm_seg_size(ring);
    uint8_t *seg = NULL;
    int sock = -1, segfd = -1, peerfd = -1;
    slime_status_t st = dial_socket(peer->ctx_id, &sock);
    if (st != SLIME_OK) return st;
    if ((st = seg_create(ring, &segfd, &seg)) == SLIME_OK) {
        wire_hello_t hello;
        hello_fill(ctx, peer, WIRE_TRANSPORT_SHM, &hello);
        int fds[2] = {segfd, ctx->mr_fd};
        st = send_with_fds(sock, &hello, sizeof hello, fds, 2, deadline);
    }
    if (st == SLIME_OK) st = recv_with_fds(sock, w, sizeof *w, &peerfd, 0, 1, deadline);
    /* refused or duplicate: SLIME_OK without a conn, the caller reads the verdict */
    if (st == SLIME_OK && w->magic == WIRE_WELCOME_MAGIC && w->verdict == WELCOME_OK &&
        (st = dialer_conn(sock, seg, len, ring, peerfd, conn)) == SLIME_OK) {
        *fd_out = sock; /* the conn owns it, and seg */
        sock = -1;
        seg = NULL;
    }
    if (peerfd >= 0) close(peerfd);
    if (seg) munmap(seg, len);
    if (segfd >= 0) close(segfd);
    if (sock >= 0) close(sock);
    return st;
}

int shm_read_hello(slime_ctx_t *ctx, pending_conn_t *pc) {
    (void)ctx;
    slime_status_t st = recv_with_fds(pc->fd, &pc->hello, sizeof pc->hello, pc->xfd, 2, 2, 0);
    if (st == SLIME_ERR_TIMEOUT) return 0; /* nothing yet: deadline 0 polls once */
    if (st != SLIME_OK || pc->hello.magic != WIRE_HELLO_MAGIC) return -1;
    pc->got = sizeof pc->hello;
    pc->peer_pid = (uint32_t)shm_peer_pid(pc->fd);
    return 1;
}

/* Refuses the dialer's shared memory: tells it why, naming it, as the
 * error does (a peer that lies about its segment is not a stranger). */
static slime_status_t refuse_memory(pending_conn_t *pc, const wire_welcome_t *w, const char *why) {
    wire_welcome_t r = *w;
    r.verdict = WELCOME_REFUSED;
    snprintf(r.reason, sizeof r.reason, "shm peer %016" PRIx64 ": %.68s", pc->hello.ctx_id, why);
    (void)send_with_fds(pc->fd, &r, sizeof r, NULL, 0, now_ns() + 1000000000ull);
    return slime_errorf(SLIME_ERR_PROTOCOL, "shm handshake: peer %016" PRIx64 " (pid %u): %s", pc->hello.ctx_id,
                        pc->peer_pid, why);
}

slime_status_t shm_send_welcome(slime_ctx_t *ctx, pending_conn_t *pc, const wire_welcome_t *w, void **conn) {
    if (!conn) return send_with_fds(pc->fd, w, sizeof *w, NULL, 0, now_ns() + 1000000000ull);
    char why[80];
    size_t len = 0;
    uint64_t ring = 0;
    mr_shared_t *pt = NULL;
    uint8_t *seg = peer_segment_map(pc->xfd[0], &len, &ring, why, sizeof why);
    if (seg && !(pt = peer_table_map(pc->xfd[1], why, sizeof why))) munmap(seg, len);
    if (!pt) return refuse_memory(pc, w, why);
    slime_status_t st = send_with_fds(pc->fd, w, sizeof *w, &ctx->mr_fd, 1, now_ns() + 1000000000ull);
    if (st == SLIME_OK && !(*conn = shm_conn_new(pc->fd, seg, len, ring, pt, false)))
        st = slime_errorf(SLIME_ERR_NOMEM, "shm conn");
    if (st != SLIME_OK) {
        munmap(seg, len);
        munmap(pt, sizeof(mr_shared_t));
    }
    return st;
}
