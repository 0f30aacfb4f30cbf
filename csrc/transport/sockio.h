/* Socket I/O for handshakes: blocking-with-deadline for the dialer's
 * half, and the acceptor's accept loop. */
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
/* The two IPv4 ends of the connected socket fd; false if it has none. */
struct sockaddr_in;
bool sock_inet_ends(int fd, struct sockaddr_in *mine, struct sockaddr_in *theirs);
/* Both ends of the connected socket fd at one address: a peer on this host. */
bool sock_same_host(int fd);

/* TCP_NODELAY, keepalive so a host that vanishes without a FIN is
 * noticed within seconds, and to a peer on this host a fixed send buffer
 * (DLSLIME_TCP_SNDBUF, 256 KiB; 0: the kernel's autotuning). */
void sock_tune_tcp(int fd);
/* Connects a non-blocking tcp socket to host:port (IPv4, network order)
 * by deadline and tunes it; `who` prefixes the error text. */
slime_status_t sock_connect_tcp(const char *who, uint32_t host, uint16_t port, uint64_t deadline,
                                int *fd_out);
/* The order in which to try a peer's tcp addresses: loopback first for a
 * peer on this host, then the ones it advertises.  Returns how many. */
struct slime_ctx;
struct wire_addr;
int sock_peer_hosts(const struct slime_ctx *ctx, const struct wire_addr *peer,
                    uint32_t order[]);
/* Accepts what the listening socket lfd has and hands each fd to
 * pending_conn_add for transport (a wire id), after tune if set.  Out of
 * fds, it drops the oldest unauthenticated connections for room; false
 * when there are none and connections still wait (transport_ops_t.accept). */
bool sock_accept_pending(struct slime_ctx *ctx, int lfd, int transport, void (*tune)(int fd));
/* The deadline for try i of n: an equal share of what is left, but at
 * least a second (or all of it). */
uint64_t sock_try_deadline(uint64_t deadline, int i, int n);

#endif
