#include "transport/sockio.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"

int sock_wait(int fd, short events, uint64_t deadline_ns) {
    for (;;) {
        uint64_t now = now_ns();
        if (now >= deadline_ns) return 0;
        uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
        if (r > 0) return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -1 : 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

slime_status_t sock_sendmsg_all(int fd, struct msghdr *msg, uint64_t deadline_ns) {
    /* handshake messages are small: one sendmsg normally takes all */
    for (;;) {
        ssize_t n = sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            size_t want = 0;
            for (size_t i = 0; i < msg->msg_iovlen; i++) want += msg->msg_iov[i].iov_len;
            if ((size_t)n == want) return SLIME_OK;
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: short send (%zd of %zu bytes)", n, want);
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: send failed: %s", strerror(errno));
        int w = sock_wait(fd, POLLOUT, deadline_ns);
        if (w == 0) return slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out sending");
        if (w < 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed while sending");
    }
}

slime_status_t sock_recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, MSG_DONTWAIT);
        if (r > 0) { got += (size_t)r; continue; }
        if (r == 0)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: peer closed the connection");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: receive failed: %s", strerror(errno));
        int w = sock_wait(fd, POLLIN, deadline_ns);
        if (w == 0) return slime_errorf(SLIME_ERR_TIMEOUT, "handshake: timed out waiting for the peer's reply");
        if (w < 0) return slime_errorf(SLIME_ERR_PEER_LOST, "handshake: connection failed while receiving");
    }
    return SLIME_OK;
}

void sock_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}
