/* The shm handshake (transport/shm_handshake.c) through the core's
 * pending-connection path: the dialer's hello, the segment and MR table
 * memfds it passes (sealed or not, of any size, with any header), then
 * frames through the dialer's ring, whose head and tail are the input's,
 * read by the shm transport.  See fz_shm_in_t. */
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "transport/shm_internal.h"

/* A memfd of len bytes holding head (and then tail at off), sealed or not. */
static int memfd_of(size_t len, bool sealed, const void *head, size_t hlen, size_t off, const void *tail,
                    size_t tlen) {
    int fd = -1;
    if (sealed) {
        if (memfd_sealed("fuzz", len, &fd) != SLIME_OK) __builtin_trap();
    } else {
        fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, (off_t)len) != 0) __builtin_trap();
    }
    if (pwrite(fd, head, min_sz(hlen, len), 0) < 0) __builtin_trap();
    if (off < len && tlen && pwrite(fd, tail, min_sz(tlen, len - off), (off_t)off) < 0) __builtin_trap();
    return fd;
}

/* Sends the hello with the fds the input asks for. */
static void send_hello(int sock, const fz_shm_in_t *in, const int fds[3]) {
    int pass[3], n = 0;
    if (in->flags & FZ_SHM_SEG_FD) pass[n++] = fds[0];
    if (in->flags & FZ_SHM_TABLE_FD) pass[n++] = fds[1];
    if (in->flags & FZ_SHM_EXTRA_FD) pass[n++] = fds[2];
    char cbuf[CMSG_SPACE(sizeof pass)];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = (void *)&in->hello,
                        .iov_len = in->flags & FZ_SHM_SHORT_HELLO ? 16 : sizeof in->hello};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n) {
        msg.msg_control = cbuf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(cm), pass, sizeof(int) * (size_t)n);
    }
    if (sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_shm_in_t in;
    memset(&in, 0, sizeof in);
    memcpy(&in, data, min_sz(size, sizeof in));
    const uint8_t *ring = data + min_sz(size, sizeof in);
    size_t ring_len = size - min_sz(size, sizeof in);
    size_t seg_len = in.seg_len % (FZ_SHM_SEG_MAX + 1);
    size_t table_len = min_sz(in.table_len, sizeof(mr_shared_t));
    int fds[3];
    fds[0] = memfd_of(seg_len, in.flags & FZ_SHM_SEG_SEALED, in.seg_head, sizeof in.seg_head,
                      SEG_HDR + SHM_BOX_AREA, ring, ring_len);
    fds[1] = memfd_of(table_len, in.flags & FZ_SHM_TABLE_SEALED, &in.table_magic, sizeof in.table_magic, 0, NULL, 0);
    fds[2] = dup(fds[0]);
    int sv[2];
    fz_socketpair(SOCK_SEQPACKET, sv);
    send_hello(sv[1], &in, fds);
    for (int i = 0; i < 3; i++) close(fds[i]);

    slime_ctx_t *ctx = fz_ctx_shared();
    pthread_mutex_lock(&ctx->lock);
    pending_conn_add(ctx, sv[0], WIRE_TRANSPORT_SHM);
    slime_ep_t *ep = list_first(&ctx->accepted, slime_ep_t, acceptq);
    /* a tail the peer set far ahead reads on for ever: a few passes */
    for (int i = 0; i < 4 && ep && ep->state == EP_UP && frames_rx(ep) > 0; i++) {}
    fz_ctx_sweep_locked(ctx);
    pthread_mutex_unlock(&ctx->lock);
    close(sv[1]);
    return 0;
}
