/* The verbs connection exchange, acceptor's side: the hello read by the
 * tcp listener's transport, then the QP info that follows it, read and
 * checked by the verbs transport (transport/verbs_handshake.c).  Bringing
 * queue pairs up needs a device, which a fuzzing machine lacks; the
 * checks before that are what stand between a peer's bytes and it. */
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "transport/verbs_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    slime_ctx_t *ctx = fz_ctx_shared();
    int sv[2];
    fz_socketpair(SOCK_STREAM, sv);
    (void)send(sv[1], data, size, MSG_DONTWAIT | MSG_NOSIGNAL); /* what fits a socket buffer: all of any -max_len below 100k */
    shutdown(sv[1], SHUT_WR);
    pending_conn_t pc = {.fd = sv[0], .xfd = {-1, -1}};
    const transport_ops_t *tcp = ctx_tp(ctx, WIRE_TRANSPORT_TCP);
    if (tcp->read_hello(ctx, &pc) == 1 && pc.hello.transport == WIRE_TRANSPORT_VERBS)
        (void)verbs_read_hello(ctx, &pc);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
