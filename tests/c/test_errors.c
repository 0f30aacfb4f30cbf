/*
 * test_errors.c - bad input gets a clear status, never a crash, and never
 * touches memory: bad arguments, out-of-bounds ranges, deregistered or
 * foreign regions, access flags, garbage and tampered descriptors, wait
 * timeouts and cancellation.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define REGION 4096u
#define GUARD (64u * 1024u)
#define GUARD_BYTE 0xFF
#define SEED_TARGET 0x7A7A
#define SEED_LOCAL 0x10CA1

typedef struct region {
    uint8_t *alloc;
    uint8_t *base;
    size_t len;
    slime_mr_t *mr;
} region_t;

static region_t region_new(slime_ctx_t *ctx, size_t len, unsigned access,
                           uint64_t seed)
{
    region_t g;
    g.alloc = h_alloc(len + 2 * GUARD);
    memset(g.alloc, GUARD_BYTE, len + 2 * GUARD);
    g.base = g.alloc + GUARD;
    g.len = len;
    h_fill(g.base, len, seed, 0);
    g.mr = h_mr_reg(ctx, g.base, len, access);
    return g;
}

static void region_check_guards(const region_t *g)
{
    H_CHECK_BYTES(g->alloc, GUARD, GUARD_BYTE);
    H_CHECK_BYTES(g->base + g->len, GUARD, GUARD_BYTE);
}

static void region_free(region_t *g)
{
    if (g->mr != NULL)
        H_CHECK_OK(slime_mr_dereg(g->mr));
    free(g->alloc);
}

/* After the failed ops, one good write_imm must be the first immediate the
 * target sees: a failed write_imm delivers nothing. */
static void send_marker_imm(h_rank_t *r, slime_mr_t *local,
                            const slime_mr_desc_t *remote, uint32_t imm)
{
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_write_imm(r->ep[1], local, 0, remote, 0, 1, imm, &req));
    H_WAIT_FREE(req, SLIME_OK);
}

static void expect_marker_imm(h_rank_t *r, uint32_t imm)
{
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_imm_recv(r->ep[0], &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_imm(req), imm);
    slime_req_free(req);
}

/* Argument errors come back at once, with no request. */
static void case_bad_arguments(h_rank_t *r)
{
    const int peer = h_peer(r);
    slime_ep_t *ep = r->ep[peer];
    region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_LOCAL);
    slime_mr_desc_t remote;
    slime_req_t *req = NULL;
    slime_mr_t *mr = NULL;
    uint8_t byte = 0;

    h_send_desc(r, peer, g.mr);
    remote = h_recv_desc(r, peer);

    /* Zero-length one-sided ops. */
    H_CHECK_STATUS(slime_read(ep, g.mr, 0, &remote, 0, 0, &req),
                   SLIME_ERR_INVAL);
    H_CHECK(req == NULL);
    H_CHECK_STATUS(slime_write(ep, g.mr, 0, &remote, 0, 0, &req),
                   SLIME_ERR_INVAL);
    H_CHECK(req == NULL);
    H_CHECK_STATUS(slime_write_imm(ep, g.mr, 0, &remote, 0, 0, 1, &req),
                   SLIME_ERR_INVAL);
    H_CHECK(req == NULL);

    /* NULL where an object is required. */
    H_CHECK_STATUS(slime_send(NULL, &byte, 1, 0, &req), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_recv(NULL, &byte, 1, 0, &req), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_send(ep, NULL, 16, 0, &req), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_recv(ep, NULL, 16, 0, &req), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_recv_any(NULL, &byte, 1, 0, &req), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_read(ep, NULL, 0, &remote, 0, 1, &req),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_write(ep, g.mr, 0, NULL, 0, 1, &req),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_imm_recv(NULL, &req), SLIME_ERR_INVAL);
    H_CHECK(req == NULL);

    /* Registration. */
    H_CHECK_STATUS(slime_mr_reg(r->ctx, g.base, 0, SLIME_ACCESS_ALL, &mr),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_mr_reg(r->ctx, NULL, 64, SLIME_ACCESS_ALL, &mr),
                   SLIME_ERR_INVAL);
    H_CHECK(mr == NULL);

    /* Address blob into a buffer that is missing or too small. */
    size_t len = 0;
    H_CHECK_STATUS(slime_ctx_address(r->ctx, NULL, &len), SLIME_ERR_INVAL);
    H_CHECK(len > 0 && len <= SLIME_ADDRESS_MAX);
    uint8_t small[1];
    size_t small_len = sizeof small;
    H_CHECK_STATUS(slime_ctx_address(r->ctx, small, &small_len),
                   SLIME_ERR_INVAL);
    H_CHECK_EQ(small_len, len);

    /* Negative timeouts: nothing waits forever. */
    uint8_t blob[SLIME_ADDRESS_MAX];
    size_t blob_len = h_ctx_address(r->ctx, blob);
    slime_ep_t *other = NULL;
    H_CHECK_STATUS(slime_ep_connect(r->ctx, blob, blob_len, -1, &other),
                   SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_ep_accept(r->ctx, -5, &other), SLIME_ERR_INVAL);
    H_CHECK(other == NULL);
    H_CHECK_OK(slime_recv(ep, &byte, 1, 12345, &req));
    H_CHECK_STATUS(slime_req_wait(req, -1), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_req_wait_all(&req, 1, -1), SLIME_ERR_INVAL);
    H_CHECK_STATUS(slime_req_test(req), SLIME_INPROGRESS);
    H_CHECK_OK(slime_req_cancel(req));
    H_WAIT_FREE(req, SLIME_ERR_CANCELED);

    /* Status texts exist for every value, known or not. */
    for (int s = -20; s <= 5; s++) {
        H_CHECK(slime_strerror((slime_status_t)s) != NULL);
        H_CHECK(slime_status_name((slime_status_t)s) != NULL);
    }
    H_CHECK(strcmp(slime_status_name(SLIME_ERR_PEER_LOST),
                   "SLIME_ERR_PEER_LOST") == 0);
    H_CHECK(strcmp(slime_status_name(SLIME_OK), "SLIME_OK") == 0);
    H_CHECK(slime_last_error() != NULL);

    h_barrier(r);
    region_free(&g);
}

/* A batch with one bad op posts nothing: the good send in it never goes
 * out, so the next message on its tag is the one sent afterwards. */
static void case_bad_batch(h_rank_t *r)
{
    enum { TAG = 50 };
    uint8_t first[32], second[32];
    h_fill(first, sizeof first, 1, 0);
    h_fill(second, sizeof second, 2, 0);
    slime_req_t *req = NULL;
    if (r->rank == 0) {
        region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_LOCAL);
        slime_mr_desc_t self;
        H_CHECK_OK(slime_mr_desc(g.mr, &self));
        slime_op_t ops[3];
        memset(ops, 0, sizeof ops);
        ops[0] = (slime_op_t){.kind = SLIME_OP_SEND, .ep = r->ep[1],
                              .buf = first, .len = sizeof first, .tag = TAG};
        ops[1] = (slime_op_t){.kind = SLIME_OP_WRITE, .ep = r->ep[1],
                              .local = g.mr, .remote = &self, .len = 0};
        ops[2] = ops[0];
        H_CHECK_STATUS(slime_batch(r->ctx, ops, 3, &req), SLIME_ERR_INVAL);
        H_CHECK(req == NULL);
        ops[1] = (slime_op_t){.kind = (slime_op_kind_t)99, .ep = r->ep[1]};
        H_CHECK_STATUS(slime_batch(r->ctx, ops, 3, &req), SLIME_ERR_INVAL);
        H_CHECK(req == NULL);
        H_CHECK_OK(slime_send(r->ep[1], second, sizeof second, TAG, &req));
        H_WAIT_FREE(req, SLIME_OK);
        region_free(&g);
        return;
    }
    uint8_t got[64];
    H_CHECK_OK(slime_recv(r->ep[0], got, sizeof got, TAG, &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), sizeof second);
    H_CHECK(memcmp(got, second, sizeof second) == 0);
    slime_req_free(req);
}

typedef struct bad_range {
    size_t local_off;
    size_t remote_off;
    size_t len;
} bad_range_t;

/* Ranges past the end, straddling it, or wrapping around size_t, on either
 * side, fail with SLIME_ERR_ACCESS and write nothing anywhere. */
static void case_out_of_bounds(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_TARGET);
        region_t marks = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
        h_send_desc(r, 0, g.mr);
        h_send_desc(r, 0, marks.mr);
        expect_marker_imm(r, 0xC0FFEE);
        (void)h_ctl_recv_u64(r, 0);
        region_check_guards(&g);
        H_CHECK_PATTERN(g.base, g.len, SEED_TARGET, 0);
        region_free(&g);
        region_free(&marks);
        return;
    }
    static const bad_range_t bad[] = {
        {0, REGION - 6, 7},          /* remote straddles the end */
        {0, REGION, 1},              /* remote starts at the end */
        {0, 0, REGION + 1},          /* remote one byte too long */
        {0, SIZE_MAX - 5, 10},       /* remote offset wraps */
        {0, 1, SIZE_MAX},            /* remote length wraps */
        {REGION - 6, 0, 7},          /* local straddles the end */
        {REGION, 0, 1},              /* local starts at the end */
        {SIZE_MAX - 1, 0, 2},        /* local offset wraps */
    };
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    slime_mr_desc_t marks = h_recv_desc(r, 1);
    region_t l = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_LOCAL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bad_range_t *b = &bad[i];
        slime_req_t *req = NULL;
        slime_status_t s;
        s = H_OUTCOME(req, slime_read(r->ep[1], l.mr, b->local_off, &remote,
                                      b->remote_off, b->len, &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
        s = H_OUTCOME(req, slime_write(r->ep[1], l.mr, b->local_off, &remote,
                                       b->remote_off, b->len, &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
        s = H_OUTCOME(req, slime_write_imm(r->ep[1], l.mr, b->local_off,
                                           &remote, b->remote_off, b->len, 7,
                                           &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
        H_CHECK_PATTERN(l.base, l.len, SEED_LOCAL, 0);
        region_check_guards(&l);
    }
    /* The endpoint survived all that. */
    H_CHECK_OK(slime_ep_status(r->ep[1]));
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_read(r->ep[1], l.mr, 0, &remote, 0, REGION, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(l.base, REGION, SEED_TARGET, 0);
    send_marker_imm(r, l.mr, &marks, 0xC0FFEE);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

/* Once the peer deregisters a region, our reads and writes of it fail with
 * SLIME_ERR_ACCESS and its memory stays as it was. */
static void case_deregistered(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_TARGET);
        region_t marks = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
        h_send_desc(r, 0, g.mr);
        h_send_desc(r, 0, marks.mr);
        (void)h_ctl_recv_u64(r, 0);
        H_CHECK_OK(slime_mr_dereg(g.mr));
        g.mr = NULL;
        h_ctl_send_u64(r, 0, 1);
        expect_marker_imm(r, 0xD0D0);
        (void)h_ctl_recv_u64(r, 0);
        region_check_guards(&g);
        H_CHECK_PATTERN(g.base, g.len, SEED_TARGET, 0);
        region_free(&g);
        region_free(&marks);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    slime_mr_desc_t marks = h_recv_desc(r, 1);
    region_t l = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_LOCAL);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_read(r->ep[1], l.mr, 0, &remote, 0, 16, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(l.base, 16, SEED_TARGET, 0);
    h_fill(l.base, l.len, SEED_LOCAL, 0);
    h_ctl_send_u64(r, 1, 1);
    (void)h_ctl_recv_u64(r, 1);

    slime_status_t s;
    s = H_OUTCOME(req, slime_read(r->ep[1], l.mr, 0, &remote, 0, 16, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    H_CHECK_PATTERN(l.base, l.len, SEED_LOCAL, 0);
    s = H_OUTCOME(req, slime_write(r->ep[1], l.mr, 0, &remote, 0, REGION,
                                   &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    s = H_OUTCOME(req, slime_write_imm(r->ep[1], l.mr, 0, &remote, 8, 8, 3,
                                       &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    H_CHECK_OK(slime_ep_status(r->ep[1]));
    send_marker_imm(r, l.mr, &marks, 0xD0D0);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

/* A descriptor that does not name a region of the endpoint's peer: one of
 * our own, and one of a third process. */
static void case_foreign_descriptor(h_rank_t *r)
{
    if (r->rank == 2) {
        region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_TARGET);
        h_send_desc(r, 0, g.mr);
        (void)h_ctl_recv_u64(r, 0);
        region_check_guards(&g);
        H_CHECK_PATTERN(g.base, g.len, SEED_TARGET, 0);
        region_free(&g);
        return;
    }
    if (r->rank == 1) {
        /* Same length and placement as rank 2's, to tempt an
         * implementation that trusts the descriptor's address. */
        region_t g = region_new(r->ctx, REGION, SLIME_ACCESS_ALL,
                                SEED_TARGET + 1);
        (void)h_ctl_recv_u64(r, 0);
        region_check_guards(&g);
        H_CHECK_PATTERN(g.base, g.len, SEED_TARGET + 1, 0);
        region_free(&g);
        return;
    }
    slime_mr_desc_t of_rank2 = h_recv_desc(r, 2);
    region_t l = region_new(r->ctx, REGION, SLIME_ACCESS_ALL, SEED_LOCAL);
    slime_mr_desc_t own;
    H_CHECK_OK(slime_mr_desc(l.mr, &own));
    const slime_mr_desc_t *foreign[] = {&of_rank2, &own};
    for (size_t i = 0; i < 2; i++) {
        slime_req_t *req = NULL;
        slime_status_t s;
        s = H_OUTCOME(req, slime_read(r->ep[1], l.mr, 0, foreign[i], 0, 64,
                                      &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        H_CHECK_PATTERN(l.base, l.len, SEED_LOCAL, 0);
        s = H_OUTCOME(req, slime_write(r->ep[1], l.mr, 0, foreign[i], 0, 64,
                                       &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
    }
    H_CHECK_PATTERN(l.base, l.len, SEED_LOCAL, 0);
    H_CHECK_OK(slime_ep_status(r->ep[1]));
    h_ctl_send_u64(r, 1, 1);
    h_ctl_send_u64(r, 2, 1);
    region_free(&l);
}

/* What a region's access flags allow; local use is always allowed. */
static void case_access_flags(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t ro = region_new(r->ctx, REGION, SLIME_ACCESS_REMOTE_READ,
                                 SEED_TARGET);
        region_t wo = region_new(r->ctx, REGION, SLIME_ACCESS_REMOTE_WRITE,
                                 SEED_TARGET + 1);
        region_t none = region_new(r->ctx, REGION, 0, SEED_TARGET + 2);
        region_t marks = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
        h_send_desc(r, 0, ro.mr);
        h_send_desc(r, 0, wo.mr);
        h_send_desc(r, 0, none.mr);
        h_send_desc(r, 0, marks.mr);
        expect_marker_imm(r, 0xACCE55);
        (void)h_ctl_recv_u64(r, 0);
        H_CHECK_PATTERN(ro.base, REGION, SEED_TARGET, 0);
        H_CHECK_PATTERN(wo.base, REGION, SEED_LOCAL, 0);
        H_CHECK_PATTERN(none.base, REGION, SEED_TARGET + 2, 0);
        region_check_guards(&ro);
        region_check_guards(&wo);
        region_check_guards(&none);
        region_free(&ro);
        region_free(&wo);
        region_free(&none);
        region_free(&marks);
        return;
    }
    slime_mr_desc_t ro = h_recv_desc(r, 1);
    slime_mr_desc_t wo = h_recv_desc(r, 1);
    slime_mr_desc_t none = h_recv_desc(r, 1);
    slime_mr_desc_t marks = h_recv_desc(r, 1);
    /* Registered with no remote access: it is only our local side. */
    region_t l = region_new(r->ctx, REGION, 0, SEED_LOCAL);
    slime_ep_t *ep = r->ep[1];
    slime_req_t *req = NULL;
    slime_status_t s;

    s = H_OUTCOME(req, slime_write(ep, l.mr, 0, &ro, 0, REGION, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    s = H_OUTCOME(req, slime_write_imm(ep, l.mr, 0, &ro, 0, 8, 9, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    s = H_OUTCOME(req, slime_read(ep, l.mr, 0, &wo, 0, REGION, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    H_CHECK_PATTERN(l.base, REGION, SEED_LOCAL, 0);
    s = H_OUTCOME(req, slime_read(ep, l.mr, 0, &none, 0, REGION, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    s = H_OUTCOME(req, slime_write(ep, l.mr, 0, &none, 0, REGION, &req));
    H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS);
    H_CHECK_PATTERN(l.base, REGION, SEED_LOCAL, 0);

    H_CHECK_OK(slime_write(ep, l.mr, 0, &wo, 0, REGION, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_read(ep, l.mr, 0, &ro, 0, REGION, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(l.base, REGION, SEED_TARGET, 0);
    send_marker_imm(r, l.mr, &marks, 0xACCE55);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

#define TAMPER_REGION 4096u
#define TAMPER_INIT 0x11
#define TAMPER_WRITTEN 0x22

/* Garbage descriptors, and every single-byte corruption of a good one:
 * each op either fails with INVAL or ACCESS, or (where the byte did not
 * matter) works inside the real region.  Nothing outside it is ever read or
 * written, and a straddling read never succeeds. */
static void case_garbage_descriptor(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, TAMPER_REGION, SLIME_ACCESS_ALL, 0);
        memset(g.base, TAMPER_INIT, TAMPER_REGION);
        h_send_desc(r, 0, g.mr);
        (void)h_ctl_recv_u64(r, 0);
        region_check_guards(&g);
        for (size_t i = 0; i < TAMPER_REGION; i++)
            H_CHECK(g.base[i] == TAMPER_INIT || g.base[i] == TAMPER_WRITTEN);
        region_free(&g);
        return;
    }
    slime_mr_desc_t good = h_recv_desc(r, 1);
    region_t l = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
    slime_ep_t *ep = r->ep[1];
    slime_req_t *req = NULL;
    slime_status_t s;

    enum { NGARBAGE = 18, NTAMPER = sizeof(slime_mr_desc_t) };
    for (int k = 0; k < NGARBAGE + NTAMPER; k++) {
        slime_mr_desc_t d;
        bool tampered = k >= NGARBAGE;
        if (k == 0)
            memset(&d, 0, sizeof d);
        else if (k == 1)
            memset(&d, 0xFF, sizeof d);
        else if (!tampered)
            h_fill(&d, sizeof d, 0xBAD0 + (uint64_t)k, 0);
        else {
            d = good;
            d.bytes[k - NGARBAGE] ^= 0xFF;
        }
        memset(l.base, 0x33, 64);
        s = H_OUTCOME(req, slime_read(ep, l.mr, 0, &d, 0, 16, &req));
        if (!tampered)
            H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        else
            H_CHECK_ONE_OF(s, SLIME_OK, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        for (int i = 0; i < 16; i++)
            H_CHECK(l.base[i] == (s == SLIME_OK ? TAMPER_INIT : 0x33) ||
                    (s == SLIME_OK && l.base[i] == TAMPER_WRITTEN));
        s = H_OUTCOME(req, slime_read(ep, l.mr, 0, &d, TAMPER_REGION - 8, 16,
                                      &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        memset(l.base, TAMPER_WRITTEN, 64);
        s = H_OUTCOME(req, slime_write(ep, l.mr, 0, &d, 0, 16, &req));
        if (!tampered)
            H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        else
            H_CHECK_ONE_OF(s, SLIME_OK, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        s = H_OUTCOME(req, slime_write(ep, l.mr, 0, &d, TAMPER_REGION - 8, 16,
                                       &req));
        H_CHECK_ONE_OF(s, SLIME_ERR_ACCESS, SLIME_ERR_INVAL);
        H_CHECK_EQ(slime_ep_status(ep), SLIME_OK);
    }
    H_CHECK_OK(slime_read(ep, l.mr, 0, &good, 0, 64, &req));
    H_WAIT_FREE(req, SLIME_OK);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

/* A wait that runs out leaves the request pending; cancel ends it, and a
 * canceled or freed receive never gets a later message. */
static void case_timeout_cancel(h_rank_t *r)
{
    enum { TAG = 999, FREED_TAG = 998, LEN = 128 };
    uint8_t msg[LEN];
    h_fill(msg, LEN, TAG, 0);
    if (r->rank == 1) {
        region_t l = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
        slime_mr_desc_t remote = h_recv_desc(r, 0);
        slime_req_t *req = NULL;
        (void)h_ctl_recv_u64(r, 0);
        H_CHECK_OK(slime_send(r->ep[0], msg, LEN, TAG, &req));
        H_WAIT(req, SLIME_OK);
        /* A finished send cannot be canceled. */
        H_CHECK_STATUS(slime_req_cancel(req), SLIME_ERR_BUSY);
        slime_req_free(req);
        H_CHECK_OK(slime_send(r->ep[0], msg, LEN, FREED_TAG, &req));
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_OK(slime_write_imm(r->ep[0], l.mr, 0, &remote, 0, 1, 5, &req));
        H_WAIT_FREE(req, SLIME_OK);
        (void)h_ctl_recv_u64(r, 0);
        region_free(&l);
        return;
    }
    slime_ep_t *ep = r->ep[1];
    region_t g = region_new(r->ctx, 64, SLIME_ACCESS_ALL, 0);
    h_send_desc(r, 1, g.mr);
    uint8_t canceled[LEN], freed[LEN], got[LEN];
    memset(canceled, 0xAB, LEN);
    memset(freed, 0xCD, LEN);
    slime_req_t *req = NULL, *imm = NULL, *any = NULL, *pair[2];

    H_CHECK_OK(slime_recv(ep, canceled, LEN, TAG, &req));
    H_CHECK_STATUS(slime_req_wait(req, 100), SLIME_ERR_TIMEOUT);
    H_CHECK_STATUS(slime_req_wait(req, 0), SLIME_ERR_TIMEOUT);
    H_CHECK_STATUS(slime_req_test(req), SLIME_INPROGRESS);
    H_CHECK_EQ(slime_req_error(req)[0], 0);
    H_CHECK_OK(slime_req_cancel(req));
    H_WAIT_FREE(req, SLIME_ERR_CANCELED);

    H_CHECK_OK(slime_imm_recv(ep, &imm));
    H_CHECK_STATUS(slime_req_wait(imm, 50), SLIME_ERR_TIMEOUT);
    H_CHECK_OK(slime_req_cancel(imm));
    H_WAIT_FREE(imm, SLIME_ERR_CANCELED);

    H_CHECK_OK(slime_recv_any(r->ctx, got, LEN, 4242, &any));
    H_CHECK_STATUS(slime_req_wait(any, 50), SLIME_ERR_TIMEOUT);
    H_CHECK_OK(slime_req_cancel(any));
    H_WAIT_FREE(any, SLIME_ERR_CANCELED);

    H_CHECK_OK(slime_recv(ep, got, LEN, 4243, &pair[0]));
    H_CHECK_OK(slime_recv(ep, got, LEN, 4244, &pair[1]));
    H_CHECK_STATUS(slime_req_wait_all(pair, 2, 50), SLIME_ERR_TIMEOUT);
    slime_req_free(pair[0]);
    slime_req_free(pair[1]);

    /* Freeing a pending receive cancels it. */
    H_CHECK_OK(slime_recv(ep, freed, LEN, FREED_TAG, &req));
    slime_req_free(req);

    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_recv(ep, got, LEN, TAG, &req));
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), LEN);
    slime_req_free(req);
    H_CHECK(memcmp(got, msg, LEN) == 0);
    memset(got, 0, LEN);
    H_CHECK_OK(slime_recv(ep, got, LEN, FREED_TAG, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK(memcmp(got, msg, LEN) == 0);
    H_CHECK_OK(slime_imm_recv(ep, &imm));
    H_WAIT(imm, SLIME_OK);
    H_CHECK_EQ(slime_req_imm(imm), 5);
    slime_req_free(imm);
    H_CHECK_BYTES(canceled, LEN, 0xAB);
    H_CHECK_BYTES(freed, LEN, 0xCD);
    h_ctl_send_u64(r, 1, 1);
    region_free(&g);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"bad_arguments", case_bad_arguments, 2, false, 0},
        {"bad_batch", case_bad_batch, 2, false, 0},
        {"out_of_bounds", case_out_of_bounds, 2, false, 0},
        {"deregistered", case_deregistered, 2, false, 0},
        {"foreign_descriptor", case_foreign_descriptor, 3, false, 0},
        {"access_flags", case_access_flags, 2, false, 0},
        {"garbage_descriptor", case_garbage_descriptor, 2, false, 0},
        {"timeout_cancel", case_timeout_cancel, 2, false, 0},
    };
    return h_main("test_errors", cases, sizeof cases / sizeof cases[0], argc,
                  argv);
}
