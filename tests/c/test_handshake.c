/*
 * test_handshake.c - who gets in: a wrong token is refused both ways and the
 * listener keeps serving good peers; garbage on the tcp port is dropped;
 * malformed blobs are rejected; a blob whose context is gone reports the
 * peer lost.
 *
 * A peer with another wire version cannot be built from the public API (the
 * HELLO format is internal), so that refusal is not tested here.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char k_token[] = "job-secret-123";

/* A message each way proves the endpoint is the real thing. */
static void ping_pong(slime_ep_t *ep, bool first)
{
    uint8_t out[100], in[100];
    slime_req_t *s = NULL, *r = NULL;
    h_fill(out, sizeof out, first ? 1 : 2, 0);
    H_CHECK_OK(slime_recv(ep, in, sizeof in, 3, &r));
    H_CHECK_OK(slime_send(ep, out, sizeof out, 3, &s));
    H_WAIT_FREE(s, SLIME_OK);
    H_WAIT(r, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(r), sizeof in);
    slime_req_free(r);
    H_CHECK_PATTERN(in, sizeof in, first ? 2 : 1, 0);
}

/* Ranks 0 and 2 share the token; rank 1's is a prefix of it and rank 3's
 * another token's first byte (an empty one is refused: test_token.py).  Every dial between mismatched tokens is refused, in either
 * direction, refused dials queue nothing for accept, and rank 0 still
 * serves rank 2 afterwards. */
static void case_wrong_token(h_rank_t *r)
{
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    opts.token = k_token;
    opts.token_len = strlen(k_token);
    if (r->rank == 1)
        opts.token_len -= 1;
    if (r->rank == 3) {
        opts.token = "x";
        opts.token_len = 1;
    }
    slime_ctx_t *ctx = h_ctx_create(&opts);
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, ctx, blobs, lens);
    slime_ep_t *ep = NULL;

    /* The strangers dial the listener. */
    if (r->rank == 1 || r->rank == 3) {
        H_CHECK_STATUS(slime_ep_connect(ctx, blobs[0], lens[0], H_WAIT_MS,
                                        &ep),
                       SLIME_ERR_REFUSED);
        H_CHECK(ep == NULL);
    }
    h_barrier(r);
    /* The listener dials the strangers. */
    if (r->rank == 0) {
        for (int k = 1; k <= 3; k += 2) {
            H_CHECK_STATUS(slime_ep_connect(ctx, blobs[k], lens[k], H_WAIT_MS,
                                            &ep),
                           SLIME_ERR_REFUSED);
            H_CHECK(ep == NULL);
        }
    }
    h_barrier(r);
    /* Nobody got in, so nobody is waiting to be accepted. */
    H_CHECK_STATUS(slime_ep_accept(ctx, 200, &ep), SLIME_ERR_TIMEOUT);
    H_CHECK(ep == NULL);
    h_barrier(r);

    if (r->rank == 0 || r->rank == 2) {
        int other = 2 - r->rank;
        H_CHECK_OK(slime_ep_connect(ctx, blobs[other], lens[other], H_WAIT_MS,
                                    &ep));
        H_CHECK_EQ(slime_ep_status(ep), SLIME_OK);
        ping_pong(ep, r->rank == 0);
    } else {
        H_CHECK_STATUS(slime_ep_connect(ctx, blobs[2], lens[2], H_WAIT_MS,
                                        &ep),
                       SLIME_ERR_REFUSED);
    }
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* A free port on 127.0.0.1 right now (someone may take it before we bind:
 * the caller retries). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    H_CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    H_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    H_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    H_CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        h_fail(__FILE__, __LINE__, "connect to 127.0.0.1:%u: %s", port,
               strerror(errno));
    return fd;
}

static void send_bytes(int fd, const void *buf, size_t len)
{
    /* MSG_NOSIGNAL: the listener may already have hung up on us. */
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
    H_CHECK(n > 0 || errno == ECONNRESET || errno == EPIPE);
}

/* True once the listener hangs up on fd (whatever it says first). */
static bool dropped_within(int fd, int ms)
{
    const int64_t deadline = h_now_ms() + ms;
    for (;;) {
        int64_t left = deadline - h_now_ms();
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char sink[4096];
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            return true;
    }
}

/* Strangers on the tcp port (garbage, a lone byte, an HTTP request, a
 * silent connection that stays open) get no endpoint, the garbage one is
 * hung up on, and a good peer is still served meanwhile.  Forces tcp, so
 * the shm run covers it as well. */
static void case_garbage_on_port(h_rank_t *r)
{
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    opts.transport = "tcp";
    opts.tcp_host = "127.0.0.1";
    slime_ctx_t *ctx = NULL;
    uint16_t port = 0;
    if (r->rank == 0) {
        for (int attempt = 0; attempt < 20 && ctx == NULL; attempt++) {
            port = free_port();
            opts.tcp_port = port;
            if (slime_ctx_create(&opts, &ctx) != SLIME_OK)
                ctx = NULL;
        }
        if (ctx == NULL)
            h_fail(__FILE__, __LINE__, "no context on a free port: %s",
                   slime_last_error());
    } else {
        ctx = h_ctx_create(&opts);
    }
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, ctx, blobs, lens);
    slime_ep_t *ep = NULL;

    if (r->rank == 0) {
        uint8_t garbage[4096];
        h_fill(garbage, sizeof garbage, 0x6A6B, 0);
        int fd = dial(port);
        send_bytes(fd, garbage, sizeof garbage);
        H_CHECK(dropped_within(fd, 10000));
        close(fd);

        close(dial(port));

        int lone = dial(port);
        send_bytes(lone, "\x01", 1);
        int http = dial(port);
        static const char get[] = "GET / HTTP/1.0\r\n\r\n";
        send_bytes(http, get, sizeof get - 1);
        int ff = dial(port);
        uint8_t ones[64];
        memset(ones, 0xFF, sizeof ones);
        send_bytes(ff, ones, sizeof ones);
        int silent = dial(port);

        H_CHECK_STATUS(slime_ep_accept(ctx, 300, &ep), SLIME_ERR_TIMEOUT);
        H_CHECK(ep == NULL);
        /* While the strangers hang on, a good peer gets in. */
        h_ctl_send_u64(r, 1, slime_ctx_id(ctx));
        H_CHECK_OK(slime_ep_accept(ctx, H_WAIT_MS, &ep));
        H_CHECK_EQ(slime_ep_peer_id(ep), h_ctl_recv_u64(r, 1));
        H_CHECK(strcmp(slime_ep_transport(ep), "tcp") == 0);
        ping_pong(ep, true);
        close(lone);
        close(http);
        close(ff);
        close(silent);
    } else {
        uint64_t listener_id = h_ctl_recv_u64(r, 0);
        H_CHECK_OK(slime_ep_connect(ctx, blobs[0], lens[0], H_WAIT_MS, &ep));
        H_CHECK_EQ(slime_ep_peer_id(ep), listener_id);
        h_ctl_send_u64(r, 0, slime_ctx_id(ctx));
        ping_pong(ep, false);
    }
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* Blobs that are not addresses are rejected as such. */
static void case_malformed_blob(h_rank_t *r)
{
    slime_ctx_t *ctx = h_ctx_create(NULL);
    uint8_t blob[SLIME_ADDRESS_MAX];
    size_t len = h_ctx_address(ctx, blob);
    slime_ep_t *ep = NULL;
    uint8_t junk[SLIME_ADDRESS_MAX];

    H_CHECK_STATUS(slime_ep_connect(ctx, NULL, len, 1000, &ep),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_ep_connect(ctx, blob, 0, 1000, &ep),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_ep_connect(ctx, blob, len / 2, 1000, &ep),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_ep_connect(ctx, blob, len - 1, 1000, &ep),
                   SLIME_ERR_INVAL);
    memset(junk, 0, sizeof junk);
    H_CHECK_STATUS(slime_ep_connect(ctx, junk, len, 1000, &ep),
                   SLIME_ERR_INVAL);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        h_fill(junk, sizeof junk, seed, 0);
        H_CHECK_STATUS(slime_ep_connect(ctx, junk, len, 1000, &ep),
                       SLIME_ERR_INVAL);
        H_CHECK_STATUS(slime_ep_connect(ctx, junk, sizeof junk, 1000, &ep),
                       SLIME_ERR_INVAL);
    }
    H_CHECK(ep == NULL);
    (void)r;
    slime_ctx_destroy(ctx);
}

/* The blob of a context that no longer exists: nobody there. */
static void case_dead_peer_blob(h_rank_t *r)
{
    slime_ctx_t *ctx = h_ctx_create(NULL);
    uint8_t blobs[H_MAX_RANKS][SLIME_ADDRESS_MAX];
    size_t lens[H_MAX_RANKS];
    h_exchange_addresses(r, ctx, blobs, lens);
    if (r->rank == 1) {
        slime_ctx_destroy(ctx);
        h_ctl_send_u64(r, 0, 1);
        (void)h_ctl_recv_u64(r, 0);
        return;
    }
    (void)h_ctl_recv_u64(r, 1);
    slime_ep_t *ep = NULL;
    H_CHECK_STATUS(slime_ep_connect(ctx, blobs[1], lens[1], 10000, &ep),
                   SLIME_ERR_PEER_LOST);
    H_CHECK(ep == NULL);
    h_ctl_send_u64(r, 1, 1);
    slime_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"wrong_token", case_wrong_token, 4, true, 0},
        {"garbage_on_port", case_garbage_on_port, 2, true, 0},
        {"malformed_blob", case_malformed_blob, 1, true, 0},
        {"dead_peer_blob", case_dead_peer_blob, 2, true, 0},
    };
    return h_main("test_handshake", cases, sizeof cases / sizeof cases[0],
                  argc, argv);
}
