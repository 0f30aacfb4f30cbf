/*
 * test_rpc.c - SlimeRPC in C: round trips of every size (inline and by
 * bulk, replies sent from a buffer and built in place), many calls in
 * flight with fewer credits and several server threads, remote errors,
 * unknown methods, a mismatched service definition, a missing server,
 * abandoned calls whose late replies must not land anywhere, a
 * server that dies mid-call, a second server thread taking a call
 * while the first is busy with one, and lent payloads (read in place at
 * the server, echoed back in place, kept by a handler).
 */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PORT 4242
#define DIGEST 0x5eed5eed5eed5eedull
#define M_ECHO 0x1001ull    /* reply = payload */
#define M_INPLACE 0x1002ull /* reply built in place: payload with each byte + 1 */
#define M_FAIL 0x1003ull    /* error reply: the payload */
#define M_SLOW 0x1004ull    /* sleeps the first payload byte * 10 ms, then echoes */
#define M_HANG 0x1005ull    /* never answered */
#define M_MEET 0x1006ull    /* waits for another M_MEET to be served at once */
#define M_KEEP 0x1007ull    /* keeps the payload past the reply (detached); replies its first byte */
#define M_TAIL 0x1008ull    /* replies the payload from its second byte, first adding 1 to each byte */
#define M_UNKNOWN 0x9999ull /* not served */

static const uint64_t methods[] = {M_ECHO, M_INPLACE, M_FAIL, M_SLOW, M_HANG, M_MEET, M_KEEP, M_TAIL};

/* M_MEET calls begun in this process (a case's rounds add up). */
static atomic_int meetings;

/* The payload's byte is the round: a round's two calls bring the count
 * to 2 * (round + 1).  Replies 1 if the other call of the round was in
 * another thread's hands within 5 s of this one's start, else 0. */
static void serve_meet(slime_rpc_call_t *call, const uint8_t *data, size_t len)
{
    int want = 2 * ((len ? data[0] : 0) + 1);
    atomic_fetch_add(&meetings, 1);
    uint8_t met = 0;
    for (int ms = 0; ms < 5000 && !met; ms++) {
        met = atomic_load(&meetings) >= want;
        if (!met) h_sleep_ms(1);
    }
    H_CHECK_OK(slime_rpc_call_reply(call, &met, 1, H_WAIT_MS));
}

static const size_t sizes[] = {0, 1, 1000, 65536 - 48, 65536 - 47, 65536, 200000, 1u << 20, 16u << 20};

/* Serves one call: what every server thread of these cases does. */
static void serve_call(slime_rpc_call_t *call)
{
    size_t len = 0;
    const uint8_t *data = slime_rpc_call_data(call, &len);
    switch (slime_rpc_call_method(call)) {
    case M_ECHO:
        H_CHECK_OK(slime_rpc_call_reply(call, data, len, H_WAIT_MS));
        return;
    case M_INPLACE: {
        uint8_t *out = NULL;
        H_CHECK_OK(slime_rpc_call_reply_buffer(call, len + 16, (void **)&out));
        for (size_t i = 0; i < len; i++)
            out[i] = (uint8_t)(data[i] + 1);
        H_CHECK_OK(slime_rpc_call_reply_commit(call, len, H_WAIT_MS));
        return;
    }
    case M_FAIL:
        H_CHECK_OK(slime_rpc_call_fail(call, data, len, H_WAIT_MS));
        return;
    case M_MEET:
        serve_meet(call, data, len);
        return;
    case M_KEEP: {
        void *mem = NULL;
        H_CHECK_OK(slime_rpc_call_detach(call, &mem));
        uint8_t first = len ? data[0] : 0;
        H_CHECK_OK(slime_rpc_call_reply(call, &first, 1, H_WAIT_MS));
        h_sleep_ms(50); /* the client calls again meanwhile: the kept block must stay as it was */
        for (size_t i = 0; i < len; i++)
            H_CHECK_EQ(data[i], h_pattern_byte(7, i));
        slime_rpc_mem_free(mem);
        return;
    }
    case M_TAIL:
        for (size_t i = 0; i < len; i++)
            ((uint8_t *)data)[i]++;
        H_CHECK_OK(slime_rpc_call_reply(call, data + 1, len - 1, H_WAIT_MS));
        return;
    case M_SLOW:
        h_sleep_ms(len ? data[0] * 10 : 0);
        /* the client may have given up: an inline reply still leaves, a
         * bulk one is refused by the zero-byte receive that drops it */
        H_CHECK_ONE_OF(slime_rpc_call_reply(call, data, len, H_WAIT_MS), SLIME_OK, SLIME_ERR_TRUNCATED);
        return;
    }
    H_CHECK(!"a method the server does not serve was handed out");
}

typedef struct server_arg {
    slime_rpc_server_t *srv;
    atomic_int served;
} server_arg_t;

static void *server_thread(void *p)
{
    server_arg_t *a = p;
    for (;;) {
        slime_rpc_call_t *call = NULL;
        slime_status_t st = slime_rpc_server_next(a->srv, H_WAIT_MS, &call);
        if (st == SLIME_ERR_CLOSED)
            return NULL;
        /* idle while another thread serves a long call: the client's
         * waits (and the case's alarm) catch a request that never comes */
        if (st == SLIME_ERR_TIMEOUT)
            continue;
        H_CHECK_OK(st);
        serve_call(call);
        atomic_fetch_add(&a->served, 1);
    }
}

/* Rank 1 serves with nthreads threads until rank 0 says it is done. */
static void run_server(h_rank_t *r, const slime_rpc_opts_t *opts, int nthreads)
{
    server_arg_t a = {0};
    H_CHECK_OK(slime_rpc_server_create(r->ctx, PORT, DIGEST, methods, sizeof methods / sizeof methods[0], opts,
                                       &a.srv));
    slime_rpc_server_t *dup = NULL;
    H_CHECK_STATUS(slime_rpc_server_create(r->ctx, PORT, 1, methods, 1, NULL, &dup), SLIME_ERR_BUSY);
    pthread_t th[4];
    for (int i = 0; i < nthreads; i++)
        H_CHECK(pthread_create(&th[i], NULL, server_thread, &a) == 0);
    h_ctl_send_u64(r, 0, 1);              /* ready */
    (void)h_ctl_recv_u64(r, 0);           /* done */
    slime_rpc_server_shutdown(a.srv);     /* the threads leave with CLOSED */
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    slime_rpc_server_destroy(a.srv);
}

static slime_rpc_client_t *client(h_rank_t *r, uint32_t credits)
{
    (void)h_ctl_recv_u64(r, 1); /* the server is up */
    slime_rpc_opts_t o;
    slime_rpc_opts_init(&o);
    o.credits = credits;
    slime_rpc_client_t *cli = NULL;
    H_CHECK_OK(slime_rpc_client_create(r->ctx, r->ep[1], PORT, DIGEST, &o, H_WAIT_MS, &cli));
    H_CHECK(slime_rpc_client_credits(cli) >= 1 && slime_rpc_client_credits(cli) <= credits);
    return cli;
}

static void call_check(slime_rpc_client_t *cli, uint64_t method, const uint8_t *msg, size_t len,
                       uint64_t seed, int add, bool remote_error)
{
    slime_rpc_req_t *req = NULL;
    H_CHECK_OK(slime_rpc_call(cli, method, msg, len, &req));
    H_CHECK_OK(slime_rpc_req_wait(req, H_WAIT_MS));
    H_CHECK_EQ(slime_rpc_req_remote_error(req), remote_error);
    size_t got = 0;
    const uint8_t *back = slime_rpc_req_data(req, &got);
    H_CHECK_EQ(got, len);
    for (size_t i = 0; i < len; i++)
        if (back[i] != (uint8_t)(h_pattern_byte(seed, i) + add))
            h_fail(__FILE__, __LINE__, "reply of %zu bytes differs at %zu", len, i);
    slime_rpc_req_free(req);
}

/* Every size through the three kinds of answer. */
static void case_sizes(h_rank_t *r)
{
    if (r->rank == 1) {
        run_server(r, NULL, 1);
        return;
    }
    slime_rpc_client_t *cli = client(r, 4);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        uint8_t *msg = h_alloc(n + 1);
        h_fill(msg, n, k, 0);
        call_check(cli, M_ECHO, msg, n, k, 0, false);
        call_check(cli, M_INPLACE, msg, n, k, 1, false);
        call_check(cli, M_FAIL, msg, n, k, 0, true);
        free(msg);
    }
    slime_rpc_client_destroy(cli);
    h_ctl_send_u64(r, 1, 1);
}

/* 64 calls in flight on 4 credits, 3 server threads; each gets its own
 * reply.  Then a 256 MiB payload both ways. */
static void case_many(h_rank_t *r)
{
    if (r->rank == 1) {
        run_server(r, NULL, 3);
        return;
    }
    slime_rpc_client_t *cli = client(r, 4);
    enum { N = 64 };
    uint8_t *msgs[N];
    slime_rpc_req_t *reqs[N];
    for (int i = 0; i < N; i++) {
        size_t n = (i % 3 == 0) ? 100000 + (size_t)i : 64 + (size_t)i;
        msgs[i] = h_alloc(n);
        h_fill(msgs[i], n, 100 + (uint64_t)i, 0);
        H_CHECK_OK(slime_rpc_call(cli, i % 2 ? M_ECHO : M_INPLACE, msgs[i], n, &reqs[i]));
    }
    for (int i = N - 1; i >= 0; i--) { /* waiting out of order drives the others too */
        size_t n = (i % 3 == 0) ? 100000 + (size_t)i : 64 + (size_t)i;
        H_CHECK_OK(slime_rpc_req_wait(reqs[i], H_WAIT_MS));
        size_t got = 0;
        const uint8_t *back = slime_rpc_req_data(reqs[i], &got);
        H_CHECK_EQ(got, n);
        int add = i % 2 ? 0 : 1;
        for (size_t j = 0; j < n; j++)
            if (back[j] != (uint8_t)(h_pattern_byte(100 + (uint64_t)i, j) + add))
                h_fail(__FILE__, __LINE__, "call %d: byte %zu differs", i, j);
        void *mem = NULL;
        H_CHECK_OK(slime_rpc_req_detach(reqs[i], &mem));
        slime_rpc_req_free(reqs[i]);
        H_CHECK(((uint8_t *)mem)[0] == back[0]); /* still ours after free */
        slime_rpc_mem_free(mem);
        free(msgs[i]);
    }
    /* no size cap: 256 MiB in one call; 64 MiB on verbs, whose emulated
     * devices (the soft-RoCE VM) take half a minute for the larger echo */
    const size_t big = strcmp(h_transport(), "verbs") == 0 ? 64u << 20 : 256u << 20;
    uint8_t *msg = h_alloc(big);
    h_fill(msg, big, 7, 0);
    slime_rpc_req_t *req = NULL;
    H_CHECK_OK(slime_rpc_call(cli, M_ECHO, msg, big, &req));
    H_CHECK_OK(slime_rpc_req_wait(req, H_WAIT_MS));
    size_t got = 0;
    const uint8_t *back = slime_rpc_req_data(req, &got);
    H_CHECK_EQ(got, big);
    H_CHECK(memcmp(back, msg, big) == 0);
    slime_rpc_req_free(req);
    free(msg);
    slime_rpc_client_destroy(cli);
    h_ctl_send_u64(r, 1, 1);
}

/* Unknown methods, a wrong digest and a missing server are clear errors;
 * a call given up on has its late reply dropped, and the next call gets
 * its own reply. */
static void case_errors(h_rank_t *r)
{
    if (r->rank == 1) {
        run_server(r, NULL, 1);
        return;
    }
    slime_rpc_client_t *cli = client(r, 2);
    slime_rpc_req_t *req = NULL;
    H_CHECK_OK(slime_rpc_call(cli, M_UNKNOWN, "x", 1, &req));
    H_CHECK_OK(slime_rpc_req_wait(req, H_WAIT_MS));
    H_CHECK(slime_rpc_req_remote_error(req));
    size_t len = 0;
    const char *text = slime_rpc_req_data(req, &len);
    H_CHECK(len > 9 && strcmp(text, "RpcError") == 0 && strstr(text + 9, "unknown method"));
    slime_rpc_req_free(req);

    slime_rpc_client_t *bad = NULL;
    H_CHECK_STATUS(slime_rpc_client_create(r->ctx, r->ep[1], PORT, DIGEST + 1, NULL, H_WAIT_MS, &bad),
                   SLIME_ERR_REFUSED);
    H_CHECK(strstr(slime_last_error(), "service definition mismatch") != NULL);
    H_CHECK(bad == NULL);
    H_CHECK_STATUS(slime_rpc_client_create(r->ctx, r->ep[1], PORT + 1, DIGEST, NULL, 300, &bad),
                   SLIME_ERR_TIMEOUT);

    /* two calls given up on (inline and bulk replies), both credits busy */
    uint8_t slow[2][200000];
    memset(slow, 0, sizeof slow);
    slow[0][0] = slow[1][0] = 30; /* 300 ms */
    slime_rpc_req_t *late[2];
    H_CHECK_OK(slime_rpc_call(cli, M_SLOW, slow[0], 10, &late[0]));
    H_CHECK_OK(slime_rpc_call(cli, M_SLOW, slow[1], sizeof slow[1], &late[1]));
    H_CHECK_STATUS(slime_rpc_req_wait(late[0], 20), SLIME_ERR_TIMEOUT);
    H_CHECK(slime_rpc_req_sent(late[0]));
    slime_rpc_req_free(late[0]);
    H_CHECK_STATUS(slime_rpc_req_wait(late[1], 1), SLIME_ERR_TIMEOUT);
    slime_rpc_req_free(late[1]); /* slow[1] stays valid until its bulk has left (below) */
    /* queued behind them until their late replies return the credits */
    uint8_t msg[5000];
    for (int i = 0; i < 4; i++) {
        h_fill(msg, sizeof msg, 40 + (uint64_t)i, 0);
        call_check(cli, M_ECHO, msg, sizeof msg, 40 + (uint64_t)i, 0, false);
    }
    /* a request freed while it waited for a credit is never sent */
    slime_rpc_req_t *a = NULL, *b = NULL, *c = NULL;
    uint8_t s1[1] = {20};
    H_CHECK_OK(slime_rpc_call(cli, M_SLOW, s1, 1, &a));
    H_CHECK_OK(slime_rpc_call(cli, M_SLOW, s1, 1, &b));
    H_CHECK_OK(slime_rpc_call(cli, M_ECHO, "never", 5, &c));
    H_CHECK(!slime_rpc_req_sent(c));
    slime_rpc_req_free(c);
    H_CHECK_OK(slime_rpc_req_wait(a, H_WAIT_MS));
    H_CHECK_OK(slime_rpc_req_wait(b, H_WAIT_MS));
    slime_rpc_req_free(a);
    slime_rpc_req_free(b);
    /* bad arguments */
    H_CHECK_STATUS(slime_rpc_call(cli, M_ECHO, NULL, 5, &a), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_rpc_call(NULL, M_ECHO, "x", 1, &a), SLIME_ERR_INVAL);
    slime_rpc_opts_t o;
    slime_rpc_opts_init(&o);
    o.slot_size = 10;
    H_CHECK_STATUS(slime_rpc_client_create(r->ctx, r->ep[1], PORT, DIGEST, &o, 100, &bad), SLIME_ERR_INVAL);
    slime_rpc_client_destroy(cli);
    h_ctl_send_u64(r, 1, 1);
}

/* Two server threads: while one is busy with a call, the other takes
 * the next (only one of them waits in the core; the other sleeps until
 * it is needed), whether the next came with the first or later.  Each
 * call waits until both are being served. */
static void case_threads_overlap(h_rank_t *r)
{
    if (r->rank == 1) {
        run_server(r, NULL, 2);
        return;
    }
    slime_rpc_client_t *cli = client(r, 4);
    for (uint8_t round = 0; round < 3; round++) {
        slime_rpc_req_t *reqs[2];
        /* together (the leader finds the second waiting as it takes the
         * first), or apart (the second comes while no thread waits) */
        for (int i = 0; i < 2; i++) {
            if (i == 1 && round % 2) h_sleep_ms(20);
            H_CHECK_OK(slime_rpc_call(cli, M_MEET, &round, 1, &reqs[i]));
        }
        for (int i = 0; i < 2; i++) {
            H_CHECK_OK(slime_rpc_req_wait(reqs[i], H_WAIT_MS));
            size_t got = 0;
            const uint8_t *back = slime_rpc_req_data(reqs[i], &got);
            H_CHECK_EQ(got, 1);
            if (back[0] != 1)
                h_fail(__FILE__, __LINE__, "round %d: call %d was served alone", round, i);
            slime_rpc_req_free(reqs[i]);
        }
    }
    slime_rpc_client_destroy(cli);
    h_ctl_send_u64(r, 1, 1);
}

/* The server dies while a call is in its hands: the call fails with
 * PEER_LOST, and so does every later call on the channel. */
static void case_server_dies(h_rank_t *r)
{
    if (r->rank == 1) {
        slime_rpc_server_t *srv = NULL;
        H_CHECK_OK(slime_rpc_server_create(r->ctx, PORT, DIGEST, methods, 5, NULL, &srv));
        h_ctl_send_u64(r, 0, 1);
        slime_rpc_call_t *call = NULL;
        H_CHECK_OK(slime_rpc_server_next(srv, H_WAIT_MS, &call));
        H_CHECK_EQ(slime_rpc_call_method(call), M_HANG);
        void *mem = NULL;
        H_CHECK_OK(slime_rpc_call_detach(call, &mem));
        h_ctl_send_u64(r, 0, 2); /* got it: kill me */
        h_sleep_ms(60000);
        return;
    }
    slime_rpc_client_t *cli = client(r, 4);
    slime_rpc_req_t *req = NULL;
    H_CHECK_OK(slime_rpc_call(cli, M_HANG, "zzz", 3, &req));
    (void)h_ctl_recv_u64(r, 1);
    h_kill_rank(r, 1);
    H_CHECK_STATUS(slime_rpc_req_wait(req, H_WAIT_MS), SLIME_ERR_PEER_LOST);
    H_CHECK(strstr(slime_rpc_req_error(req), "server is gone") != NULL);
    slime_rpc_req_free(req);
    slime_rpc_req_t *again = NULL;
    H_CHECK_STATUS(slime_rpc_call(cli, M_ECHO, "x", 1, &again), SLIME_ERR_PEER_LOST);
    slime_rpc_client_destroy(cli);
}

static void lend_call(slime_rpc_client_t *cli, uint64_t method, const uint8_t *msg, size_t len, void *out,
                      size_t out_cap, slime_rpc_req_t **req)
{
    slime_rpc_call_args_t a = {.size = sizeof a, .buf = msg, .len = len, .reply_buf = out, .reply_cap = out_cap,
                               .flags = SLIME_RPC_CALL_LEND};
    H_CHECK_OK(slime_rpc_call_args(cli, method, &a, req));
    H_CHECK_OK(slime_rpc_req_wait(*req, H_WAIT_MS));
    H_CHECK(!slime_rpc_req_remote_error(*req));
}

/* req's reply is len bytes of seed's pattern from byte from, plus add. */
static void check_reply(slime_rpc_req_t *req, size_t len, uint64_t seed, size_t from, int add)
{
    size_t got = 0;
    const uint8_t *p = slime_rpc_req_data(req, &got);
    H_CHECK_EQ(got, len);
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(h_pattern_byte(seed, from + i) + add))
            h_fail(__FILE__, __LINE__, "reply of %zu bytes differs at %zu", len, i);
}

/* Lent payloads (lend.h).  Over shm every large call is lent and its
 * echo read in place: a result held while the next call takes the other
 * block, a reply into the caller's buffer, a slice of a payload changed
 * in place; a payload the server keeps past its reply is never lent
 * again (the server checks it stays as sent while the client calls on).
 * Over tcp nothing is lent, and every reply is the same. */
static void case_lend(h_rank_t *r)
{
    if (r->rank == 1) {
        run_server(r, NULL, 1);
        return;
    }
    slime_rpc_client_t *cli = client(r, 4);
    slime_rpc_lend_stats_t st;
    bool on = slime_rpc_client_lend_stats(cli, &st);
    H_CHECK_EQ(on, !strcmp(h_transport(), "shm") || !strcmp(h_transport(), "auto"));
    size_t n = 2u << 20;
    uint8_t *a = h_alloc(n), *b = h_alloc(n), *k = h_alloc(n), *out = h_alloc(n);
    h_fill(a, n, 1, 0);
    h_fill(b, n, 2, 0);
    h_fill(k, n, 7, 0);
    slime_rpc_req_t *ra = NULL, *rb = NULL;
    lend_call(cli, M_ECHO, a, n, NULL, 0, &ra);
    lend_call(cli, M_ECHO, b, n, NULL, 0, &rb);
    check_reply(ra, n, 1, 0, 0);
    check_reply(rb, n, 2, 0, 0);
    slime_rpc_req_free(ra);
    slime_rpc_req_free(rb);
    lend_call(cli, M_ECHO, a, n, out, n, &ra);
    H_CHECK(slime_rpc_req_in_reply_buf(ra));
    check_reply(ra, n, 1, 0, 0);
    slime_rpc_req_free(ra);
    lend_call(cli, M_TAIL, a, n, NULL, 0, &ra);
    check_reply(ra, n - 1, 1, 1, 1);
    size_t got = 0;
    const uint8_t *tail = slime_rpc_req_data(ra, &got);
    void *mem = NULL;
    H_CHECK_OK(slime_rpc_req_detach(ra, &mem)); /* the reply outlives its request */
    slime_rpc_req_free(ra);
    for (size_t i = 0; i < got; i++)
        H_CHECK_EQ(tail[i], (uint8_t)(h_pattern_byte(1, i + 1) + 1));
    slime_rpc_mem_free(mem);
    lend_call(cli, M_ECHO, a, 1000, NULL, 0, &ra); /* too small to lend */
    check_reply(ra, 1000, 1, 0, 0);
    slime_rpc_req_free(ra);
    slime_rpc_client_lend_stats(cli, &st);
    H_CHECK_EQ(st.lent, on ? 4u : 0u);
    H_CHECK_EQ(st.in_place, on ? 4u : 0u);
    H_CHECK_EQ(st.blocks, on ? 2u : 0u);
    lend_call(cli, M_KEEP, k, n, NULL, 0, &ra);
    check_reply(ra, 1, 7, 0, 0);
    slime_rpc_req_free(ra);
    lend_call(cli, M_ECHO, a, n, NULL, 0, &ra); /* while the server still checks the kept block */
    lend_call(cli, M_ECHO, b, n, NULL, 0, &rb);
    check_reply(ra, n, 1, 0, 0);
    check_reply(rb, n, 2, 0, 0);
    slime_rpc_req_free(ra);
    slime_rpc_req_free(rb);
    slime_rpc_client_lend_stats(cli, &st);
    H_CHECK_EQ(st.kept, on ? 1u : 0u);
    H_CHECK_EQ(st.blocks, on ? 3u : 0u);
    free(a);
    free(b);
    free(k);
    free(out);
    slime_rpc_client_destroy(cli);
    h_ctl_send_u64(r, 1, 1);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"sizes", case_sizes, 2, false, 0},
        {"many", case_many, 2, false, 0},
        {"errors", case_errors, 2, false, 0},
        {"server_dies", case_server_dies, 2, false, 1u << 1},
        {"threads_overlap", case_threads_overlap, 2, false, 0},
        {"lend", case_lend, 2, false, 0},
    };
    return h_main("test_rpc", cases, sizeof cases / sizeof cases[0], argc, argv);
}
