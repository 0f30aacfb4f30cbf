/* Blocking-with-deadline socket I/O for the dialer's half of handshakes. */
#ifndef SLIME_SOCKIO_H
#define SLIME_SOCKIO_H

#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/socket.h>

#include "dlslime/dlslime.h"

/* Waits for events on fd until deadline: 1 ready, 0 timed out, -1 error. */
int sock_wait(int fd, short events, uint64_t deadline_ns);
/* Sends/receives exactly msg (with its control data), or fails. */
slime_status_t sock_sendmsg_all(int fd, struct msghdr *msg, uint64_t deadline_ns);
slime_status_t sock_recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns);
void sock_set_nonblock(int fd);

#endif
