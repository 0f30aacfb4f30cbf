/*
 * test_onesided.c - read, write and write_imm between registered regions.
 * The target takes no part: it registers, hands out descriptors, then only
 * blocks on the control socket until the initiator says it is done, and
 * checks its memory afterwards.
 */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SEED_TARGET 0x7A7A
#define SEED_LOCAL 0x10CA1
#define GUARD 4096
#define GUARD_BYTE 0x5A

typedef struct span {
    size_t remote_off;
    size_t local_off;
    size_t len;
} span_t;

/* A region placed at an odd address inside a guarded allocation. */
typedef struct region {
    uint8_t *alloc;
    uint8_t *base;
    size_t len;
    slime_mr_t *mr;
} region_t;

static region_t region_new(slime_ctx_t *ctx, size_t len, size_t skew,
                           uint64_t seed)
{
    region_t g;
    g.alloc = h_alloc(len + skew + 2 * GUARD);
    memset(g.alloc, GUARD_BYTE, len + skew + 2 * GUARD);
    g.base = g.alloc + GUARD + skew;
    g.len = len;
    h_fill(g.base, len, seed, 0);
    g.mr = h_mr_reg(ctx, g.base, len, SLIME_ACCESS_ALL);
    return g;
}

static void region_check_guards(const region_t *g, size_t skew)
{
    H_CHECK_BYTES(g->alloc, GUARD + skew, GUARD_BYTE);
    H_CHECK_BYTES(g->base + g->len, GUARD, GUARD_BYTE);
}

static void region_free(region_t *g)
{
    H_CHECK_OK(slime_mr_dereg(g->mr));
    free(g->alloc);
}

/* Target side of every case: serve, wait for "done", check guards. */
static void serve_until_done(h_rank_t *r, region_t *g, size_t skew)
{
    (void)h_ctl_recv_u64(r, 0);
    region_check_guards(g, skew);
}

#define RO_LEN ((4u << 20) + 123u)
#define RO_LOCAL ((4u << 20) + 4096u)

static void case_read_offsets(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, RO_LEN, 1, SEED_TARGET);
        h_send_desc(r, 0, g.mr);
        serve_until_done(r, &g, 1);
        H_CHECK_PATTERN(g.base, g.len, SEED_TARGET, 0);
        region_free(&g);
        return;
    }
    static const span_t reads[] = {
        {0, 0, 1},
        {1, 3, 1},
        {4095, 17, 2},
        {12345, 100, 4097},
        {7, 65537, 65537},
        {(1u << 20) + 13u, 5, (1u << 20) + 13u},
        {RO_LEN - 1, RO_LOCAL - 1, 1},
        {RO_LEN - 4096, 1, 4096},
        {0, 0, RO_LEN},
        {123, RO_LOCAL - (3u << 20), 3u << 20},
    };
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    H_CHECK_EQ(slime_mr_desc_len(&remote), RO_LEN);
    region_t l = region_new(r->ctx, RO_LOCAL, 3, SEED_LOCAL);
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
        const span_t *s = &reads[i];
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_read(r->ep[1], l.mr, s->local_off, &remote,
                              s->remote_off, s->len, &req));
        H_WAIT_FREE(req, SLIME_OK);
        H_CHECK_PATTERN(l.base + s->local_off, s->len, SEED_TARGET,
                        s->remote_off);
        /* Nothing around the span moved. */
        H_CHECK_PATTERN(l.base, s->local_off, SEED_LOCAL, 0);
        size_t end = s->local_off + s->len;
        H_CHECK_PATTERN(l.base + end, l.len - end, SEED_LOCAL, end);
        region_check_guards(&l, 3);
        h_fill(l.base + s->local_off, s->len, SEED_LOCAL, s->local_off);
    }
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

/* Disjoint, sorted by remote_off, so the target can check every byte. */
static const span_t k_writes[] = {
    {0, 0, 1},
    {2, 5, 1},
    {4095, 100, 4097},
    {10000, 3, 65537},
    {100000, 77, (1u << 20) + 13u},
    {2u << 20, 9, 4096},
    {3u << 20, 0, 1u << 20},
    {RO_LEN - 1, 11, 1},
};
#define NWRITES (sizeof k_writes / sizeof k_writes[0])

/* Every byte of the target region is either untouched or the local byte
 * that the span covering it names. */
static void check_written(const uint8_t *base, size_t len, const span_t *spans,
                          size_t n, uint64_t local_seed)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        H_CHECK(spans[i].remote_off >= at);
        H_CHECK_PATTERN(base + at, spans[i].remote_off - at, SEED_TARGET, at);
        H_CHECK_PATTERN(base + spans[i].remote_off, spans[i].len, local_seed,
                        spans[i].local_off);
        at = spans[i].remote_off + spans[i].len;
    }
    H_CHECK_PATTERN(base + at, len - at, SEED_TARGET, at);
}

static void case_write_offsets(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, RO_LEN, 1, SEED_TARGET);
        h_send_desc(r, 0, g.mr);
        serve_until_done(r, &g, 1);
        check_written(g.base, g.len, k_writes, NWRITES, SEED_LOCAL);
        region_free(&g);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    region_t l = region_new(r->ctx, RO_LOCAL, 3, SEED_LOCAL);
    for (size_t i = 0; i < NWRITES; i++) {
        const span_t *s = &k_writes[i];
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_write(r->ep[1], l.mr, s->local_off, &remote,
                               s->remote_off, s->len, &req));
        H_WAIT_FREE(req, SLIME_OK);
    }
    /* A write must not change its source. */
    H_CHECK_PATTERN(l.base, l.len, SEED_LOCAL, 0);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

#define BIG (64u << 20)

/* 64 MiB written at odd offsets into one region and read from another. */
static void case_large(h_rank_t *r)
{
    if (r->rank == 1) {
        region_t into = region_new(r->ctx, BIG + 7, 0, SEED_TARGET);
        region_t from = region_new(r->ctx, BIG, 0, SEED_TARGET + 1);
        h_send_desc(r, 0, into.mr);
        h_send_desc(r, 0, from.mr);
        serve_until_done(r, &into, 0);
        region_check_guards(&from, 0);
        H_CHECK_PATTERN(into.base, 7, SEED_TARGET, 0);
        H_CHECK_PATTERN(into.base + 7, BIG, SEED_LOCAL, 3);
        H_CHECK_PATTERN(from.base, BIG, SEED_TARGET + 1, 0);
        region_free(&into);
        region_free(&from);
        return;
    }
    slime_mr_desc_t into = h_recv_desc(r, 1);
    slime_mr_desc_t from = h_recv_desc(r, 1);
    region_t src = region_new(r->ctx, BIG + 3, 0, SEED_LOCAL);
    region_t dst = region_new(r->ctx, BIG, 0, 0);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_write(r->ep[1], src.mr, 3, &into, 7, BIG, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_read(r->ep[1], dst.mr, 0, &from, 0, BIG, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(dst.base, BIG, SEED_TARGET + 1, 0);
    region_check_guards(&dst, 0);
    h_ctl_send_u64(r, 1, 1);
    region_free(&src);
    region_free(&dst);
}

enum { NIMM = 100, IMM_SPAN = 1000 };

static uint32_t imm_of(int i)
{
    return i == NIMM - 1 ? UINT32_MAX : (uint32_t)i * 2654435761u;
}

/* Immediates arrive in the order written, whether imm_recv was posted
 * before or after they came, and the data is in place when they do. */
static void case_write_imm(h_rank_t *r)
{
    const size_t len = (size_t)NIMM * IMM_SPAN;
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, len, 0, SEED_TARGET);
        slime_ep_t *ep = r->ep[0];
        slime_req_t *req = NULL;
        h_send_desc(r, 0, g.mr);

        /* Posted before the write. */
        H_CHECK_OK(slime_imm_recv(ep, &req));
        h_ctl_send_u64(r, 0, 1);
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_imm(req), 0xDEADBEEFu);
        slime_req_free(req);
        H_CHECK_PATTERN(g.base, 4096, SEED_LOCAL, 0);
        h_ctl_send_u64(r, 0, 1);

        /* Posted after all of them arrived. */
        (void)h_ctl_recv_u64(r, 0);
        for (int i = 0; i < NIMM; i++) {
            H_CHECK_OK(slime_imm_recv(ep, &req));
            H_WAIT(req, SLIME_OK);
            H_CHECK_EQ(slime_req_imm(req), imm_of(i));
            slime_req_free(req);
        }
        H_CHECK_PATTERN(g.base, len, SEED_LOCAL + 1, 0);

        /* Half before, half while they stream in. */
        slime_req_t *reqs[NIMM];
        for (int i = 0; i < NIMM / 2; i++)
            H_CHECK_OK(slime_imm_recv(ep, &reqs[i]));
        h_ctl_send_u64(r, 0, 1);
        h_sleep_ms(2);
        for (int i = NIMM / 2; i < NIMM; i++)
            H_CHECK_OK(slime_imm_recv(ep, &reqs[i]));
        for (int i = 0; i < NIMM; i++) {
            H_WAIT(reqs[i], SLIME_OK);
            H_CHECK_EQ(slime_req_imm(reqs[i]), imm_of(i));
            /* Write i landed before its immediate was delivered. */
            H_CHECK_PATTERN(g.base + (size_t)i * IMM_SPAN, IMM_SPAN,
                            SEED_LOCAL + 2, (size_t)i * IMM_SPAN);
            slime_req_free(reqs[i]);
        }
        (void)h_ctl_recv_u64(r, 0);
        region_free(&g);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 1);
    slime_ep_t *ep = r->ep[1];
    region_t l = region_new(r->ctx, len, 0, SEED_LOCAL);
    slime_req_t *reqs[NIMM];

    (void)h_ctl_recv_u64(r, 1);
    H_CHECK_OK(slime_write_imm(ep, l.mr, 0, &remote, 0, 4096, 0xDEADBEEFu,
                               &reqs[0]));
    H_WAIT_FREE(reqs[0], SLIME_OK);
    (void)h_ctl_recv_u64(r, 1); /* checked before we overwrite it */

    h_fill(l.base, len, SEED_LOCAL + 1, 0);
    for (int i = 0; i < NIMM; i++)
        H_CHECK_OK(slime_write_imm(ep, l.mr, (size_t)i * IMM_SPAN, &remote,
                                   (size_t)i * IMM_SPAN, IMM_SPAN, imm_of(i),
                                   &reqs[i]));
    H_CHECK_OK(slime_req_wait_all(reqs, NIMM, H_WAIT_MS));
    for (int i = 0; i < NIMM; i++)
        slime_req_free(reqs[i]);
    h_ctl_send_u64(r, 1, 1);

    h_fill(l.base, len, SEED_LOCAL + 2, 0);
    (void)h_ctl_recv_u64(r, 1);
    for (int i = 0; i < NIMM; i++)
        H_CHECK_OK(slime_write_imm(ep, l.mr, (size_t)i * IMM_SPAN, &remote,
                                   (size_t)i * IMM_SPAN, IMM_SPAN, imm_of(i),
                                   &reqs[i]));
    H_CHECK_OK(slime_req_wait_all(reqs, NIMM, H_WAIT_MS));
    for (int i = 0; i < NIMM; i++)
        slime_req_free(reqs[i]);
    h_ctl_send_u64(r, 1, 1);
    region_free(&l);
}

enum { NBATCH = 300, STRIDE = 13000, NBATCH_IMM = 4 };
#define BATCH_REGION (4u << 20)

static span_t batch_read(int i)
{
    span_t s = {(size_t)i * STRIDE + (size_t)(i % 7), (size_t)i * STRIDE,
                1u + ((size_t)i * 577u) % 12000u};
    return s;
}

static span_t batch_write(int i)
{
    span_t s = {(size_t)i * STRIDE + (size_t)(i % 5), (size_t)i * STRIDE + 5u,
                1u + ((size_t)i * 389u) % 12000u};
    return s;
}

/* 300 reads from one region, 300 writes into another and a few
 * write_imm, all in one batch completed by one request. */
static void case_batch(h_rank_t *r)
{
    span_t writes[NBATCH + NBATCH_IMM];
    for (int i = 0; i < NBATCH; i++)
        writes[i] = batch_write(i);
    for (int i = 0; i < NBATCH_IMM; i++) {
        span_t s = {BATCH_REGION - 4096u * (size_t)(NBATCH_IMM - i), 0, 100};
        writes[NBATCH + i] = s;
    }
    if (r->rank == 1) {
        region_t rd = region_new(r->ctx, BATCH_REGION, 0, SEED_TARGET + 5);
        region_t wr = region_new(r->ctx, BATCH_REGION, 0, SEED_TARGET);
        h_send_desc(r, 0, rd.mr);
        h_send_desc(r, 0, wr.mr);
        serve_until_done(r, &wr, 0);
        region_check_guards(&rd, 0);
        H_CHECK_PATTERN(rd.base, rd.len, SEED_TARGET + 5, 0);
        check_written(wr.base, wr.len, writes, NBATCH + NBATCH_IMM,
                      SEED_LOCAL);
        for (uint32_t i = 0; i < NBATCH_IMM; i++) {
            slime_req_t *req = NULL;
            H_CHECK_OK(slime_imm_recv(r->ep[0], &req));
            H_WAIT(req, SLIME_OK);
            H_CHECK_EQ(slime_req_imm(req), 1000u + i);
            slime_req_free(req);
        }
        region_free(&rd);
        region_free(&wr);
        return;
    }
    slime_mr_desc_t rd = h_recv_desc(r, 1);
    slime_mr_desc_t wr = h_recv_desc(r, 1);
    region_t in = region_new(r->ctx, BATCH_REGION, 0, 0);
    region_t out = region_new(r->ctx, BATCH_REGION, 0, SEED_LOCAL);
    slime_op_t *ops = h_alloc(sizeof(slime_op_t) * (2 * NBATCH + NBATCH_IMM));
    size_t n = 0;
    for (int i = 0; i < NBATCH; i++) {
        span_t s = batch_read(i);
        ops[n++] = (slime_op_t){.kind = SLIME_OP_READ, .ep = r->ep[1],
                                .len = s.len, .local = in.mr,
                                .local_off = s.local_off, .remote = &rd,
                                .remote_off = s.remote_off};
        ops[n++] = (slime_op_t){.kind = SLIME_OP_WRITE, .ep = r->ep[1],
                                .len = writes[i].len, .local = out.mr,
                                .local_off = writes[i].local_off,
                                .remote = &wr,
                                .remote_off = writes[i].remote_off};
    }
    for (int i = 0; i < NBATCH_IMM; i++) {
        const span_t *s = &writes[NBATCH + i];
        ops[n++] = (slime_op_t){.kind = SLIME_OP_WRITE_IMM, .ep = r->ep[1],
                                .len = s->len, .local = out.mr,
                                .local_off = s->local_off, .remote = &wr,
                                .remote_off = s->remote_off,
                                .imm = 1000u + (uint32_t)i};
    }
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_batch(r->ctx, ops, n, &req));
    H_WAIT_FREE(req, SLIME_OK);
    for (int i = 0; i < NBATCH; i++) {
        span_t s = batch_read(i);
        H_CHECK_PATTERN(in.base + s.local_off, s.len, SEED_TARGET + 5,
                        s.remote_off);
    }
    h_ctl_send_u64(r, 1, 1);
    free(ops);
    region_free(&in);
    region_free(&out);
}

/* Long runs of small ops in one direction, which shm copies many to a
 * system call: 600 reads (more than one call takes) with a large read
 * that ends a run and then reads of a second region, then 600 writes in
 * ascending order and a write_imm.  Every byte lands where its op says. */
enum { NRUN = 600, RUN_STRIDE = 5000 };
#define RUN_LARGE ((1u << 20) + 17u)

static span_t run_span(int i)
{
    span_t s = {(size_t)i * RUN_STRIDE + (size_t)(i % 3), (size_t)i * RUN_STRIDE,
                1u + ((size_t)i * 997u) % 4000u};
    return s;
}

static void case_batch_runs(h_rank_t *r)
{
    const size_t len = (size_t)NRUN * RUN_STRIDE + RUN_LARGE;
    span_t writes[NRUN + 1];
    for (int i = 0; i < NRUN; i++)
        writes[i] = run_span(i);
    writes[NRUN] = (span_t){len - 64, 0, 64};     /* the write_imm */
    if (r->rank == 1) {
        region_t rd = region_new(r->ctx, len, 0, SEED_TARGET + 5);
        region_t rd2 = region_new(r->ctx, len, 0, SEED_TARGET + 6);
        region_t wr = region_new(r->ctx, len, 0, SEED_TARGET);
        h_send_desc(r, 0, rd.mr);
        h_send_desc(r, 0, rd2.mr);
        h_send_desc(r, 0, wr.mr);
        serve_until_done(r, &wr, 0);
        check_written(wr.base, wr.len, writes, NRUN + 1, SEED_LOCAL);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_imm_recv(r->ep[0], &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_imm(req), 77u);
        slime_req_free(req);
        region_free(&rd);
        region_free(&rd2);
        region_free(&wr);
        return;
    }
    slime_mr_desc_t rd = h_recv_desc(r, 1);
    slime_mr_desc_t rd2 = h_recv_desc(r, 1);
    slime_mr_desc_t wr = h_recv_desc(r, 1);
    region_t in = region_new(r->ctx, 2 * len, 0, 0);
    region_t out = region_new(r->ctx, len, 0, SEED_LOCAL);
    slime_op_t *ops = h_alloc(sizeof(slime_op_t) * (2 * NRUN + 2));
    size_t n = 0;
    for (int i = 0; i < NRUN; i++) {
        span_t s = run_span(i);
        if (i == NRUN / 2)    /* ends a run; the rest come from rd2 */
            ops[n++] = (slime_op_t){.kind = SLIME_OP_READ, .ep = r->ep[1], .len = RUN_LARGE,
                                    .local = in.mr, .local_off = len, .remote = &rd,
                                    .remote_off = 0};
        ops[n++] = (slime_op_t){.kind = SLIME_OP_READ, .ep = r->ep[1], .len = s.len,
                                .local = in.mr, .local_off = s.local_off,
                                .remote = i < NRUN / 2 ? &rd : &rd2, .remote_off = s.remote_off};
    }
    for (int i = 0; i <= NRUN; i++)
        ops[n++] = (slime_op_t){.kind = i < NRUN ? SLIME_OP_WRITE : SLIME_OP_WRITE_IMM,
                                .ep = r->ep[1], .len = writes[i].len, .local = out.mr,
                                .local_off = writes[i].local_off, .remote = &wr,
                                .remote_off = writes[i].remote_off, .imm = 77u};
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_batch(r->ctx, ops, n, &req));
    H_WAIT_FREE(req, SLIME_OK);
    for (int i = 0; i < NRUN; i++) {
        span_t s = run_span(i);
        H_CHECK_PATTERN(in.base + s.local_off, s.len, SEED_TARGET + (i < NRUN / 2 ? 5 : 6),
                        s.remote_off);
    }
    H_CHECK_PATTERN(in.base + len, RUN_LARGE, SEED_TARGET + 5, 0);
    h_ctl_send_u64(r, 1, 1);
    free(ops);
    region_free(&in);
    region_free(&out);
}

/* Ranks 1 and 2 write into disjoint halves of rank 0's region at once
 * and read each other's half back. */
static void case_concurrent_writers(h_rank_t *r)
{
    const size_t half = 8u << 20;
    if (r->rank == 0) {
        region_t g = region_new(r->ctx, 2 * half, 0, SEED_TARGET);
        h_send_desc(r, 1, g.mr);
        h_send_desc(r, 2, g.mr);
        (void)h_ctl_recv_u64(r, 1);
        (void)h_ctl_recv_u64(r, 2);
        region_check_guards(&g, 0);
        H_CHECK_PATTERN(g.base, half, SEED_LOCAL + 1, 0);
        H_CHECK_PATTERN(g.base + half, half, SEED_LOCAL + 2, 0);
        region_free(&g);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 0);
    region_t l = region_new(r->ctx, half, 0, SEED_LOCAL + (uint64_t)r->rank);
    const size_t chunk = 256 * H_KIB;
    slime_req_t *reqs[(8u << 20) / (256 * 1024)];
    const size_t n = half / chunk;
    for (size_t i = 0; i < n; i++)
        H_CHECK_OK(slime_write(r->ep[0], l.mr, i * chunk, &remote,
                               (size_t)(r->rank - 1) * half + i * chunk, chunk,
                               &reqs[i]));
    H_CHECK_OK(slime_req_wait_all(reqs, n, H_WAIT_MS));
    for (size_t i = 0; i < n; i++)
        slime_req_free(reqs[i]);
    h_ctl_send_u64(r, 0, 1);
    region_free(&l);
}

/* Threads of one rank read and write large disjoint slices of one remote
 * region at once: the copies the context's team splits (core/team.c)
 * interleave without mixing up whose bytes go where. */
enum { NTHREADS = 3 };
#define SLICE ((6u << 20) + 5u)

typedef struct slice_job {
    h_rank_t *r;
    slime_mr_desc_t remote;
    region_t local;
    int i;
} slice_job_t;

static void *slice_thread(void *arg)
{
    slice_job_t *j = arg;
    slime_req_t *req = NULL;
    uint8_t *back = h_alloc(SLICE);
    slime_mr_t *mr = h_mr_reg(j->r->ctx, back, SLICE, SLIME_ACCESS_ALL);
    H_CHECK_OK(slime_write(j->r->ep[0], j->local.mr, 0, &j->remote,
                           (size_t)j->i * SLICE, SLICE, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_read(j->r->ep[0], mr, 0, &j->remote,
                          (size_t)j->i * SLICE, SLICE, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(back, SLICE, SEED_LOCAL + (uint64_t)j->i, 0);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(back);
    return NULL;
}

static void case_threads_large(h_rank_t *r)
{
    if (r->rank == 0) {
        region_t g = region_new(r->ctx, NTHREADS * SLICE, 1, SEED_TARGET);
        h_send_desc(r, 1, g.mr);
        (void)h_ctl_recv_u64(r, 1);
        region_check_guards(&g, 1);
        for (int i = 0; i < NTHREADS; i++)
            H_CHECK_PATTERN(g.base + (size_t)i * SLICE, SLICE,
                            SEED_LOCAL + (uint64_t)i, 0);
        region_free(&g);
        return;
    }
    slime_mr_desc_t remote = h_recv_desc(r, 0);
    slice_job_t jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (slice_job_t){r, remote,
                                region_new(r->ctx, SLICE, 3, SEED_LOCAL + (uint64_t)i), i};
        H_CHECK(pthread_create(&th[i], NULL, slice_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        region_check_guards(&jobs[i].local, 3);
        region_free(&jobs[i].local);
    }
    h_ctl_send_u64(r, 0, 1);
}

/* Ops on both sides of the size from which shm leaves unmapped one-sided
 * ops to the rings (DLSLIME_SHM_CMA_MAX, 32 MiB), queued together in one
 * batch so each path runs with ops of the other queued around it: small
 * and 8 MiB ops go by CMA, 40 MiB ones (a write, a read, a write_imm)
 * by frames.  Every byte lands where its op says, the immediate after
 * its data. */
#define PATHS_BIG ((40u << 20) + 5u)
#define PATHS_MID ((8u << 20) + 3u)
#define PATHS_REGION (2u * PATHS_BIG + 2u * PATHS_MID + 4096u)

static void case_size_paths(h_rank_t *r)
{
    /* remote layout: BIG written with the immediate, BIG read, MID
     * written, 100 bytes written, then (from small + 4096) MID read */
    const size_t w_big = 0, r_big = PATHS_BIG, w_mid = 2u * PATHS_BIG, small = w_mid + PATHS_MID,
                 r_mid = small + 4096u;
    if (r->rank == 1) {
        region_t g = region_new(r->ctx, PATHS_REGION, 1, SEED_TARGET);
        h_send_desc(r, 0, g.mr);
        slime_req_t *req = NULL;
        H_CHECK_OK(slime_imm_recv(r->ep[0], &req));
        H_WAIT(req, SLIME_OK);
        H_CHECK_EQ(slime_req_imm(req), 77);
        slime_req_free(req);
        /* the write_imm's data was in place when its immediate came */
        H_CHECK_PATTERN(g.base + w_big, PATHS_BIG, SEED_LOCAL + 2, 0);
        serve_until_done(r, &g, 1);
        H_CHECK_PATTERN(g.base + r_big, PATHS_BIG, SEED_TARGET, r_big);
        H_CHECK_PATTERN(g.base + w_mid, PATHS_MID, SEED_LOCAL, 0);
        H_CHECK_PATTERN(g.base + small, 100, SEED_LOCAL + 1, 0);
        H_CHECK_PATTERN(g.base + small + 100, PATHS_REGION - small - 100, SEED_TARGET, small + 100);
        region_free(&g);
        return;
    }
    slime_mr_desc_t d = h_recv_desc(r, 1);
    region_t mid = region_new(r->ctx, PATHS_MID, 0, SEED_LOCAL);
    region_t tiny = region_new(r->ctx, 100, 0, SEED_LOCAL + 1);
    region_t big = region_new(r->ctx, PATHS_BIG, 0, SEED_LOCAL + 2);
    region_t in = region_new(r->ctx, PATHS_BIG + PATHS_MID, 0, 0);
    slime_op_t ops[] = {
        {.kind = SLIME_OP_WRITE, .ep = r->ep[1], .len = 100, .local = tiny.mr, .remote = &d, .remote_off = small},
        {.kind = SLIME_OP_READ, .ep = r->ep[1], .len = PATHS_BIG, .local = in.mr, .remote = &d, .remote_off = r_big},
        {.kind = SLIME_OP_READ, .ep = r->ep[1], .len = PATHS_MID, .local = in.mr, .local_off = PATHS_BIG,
         .remote = &d, .remote_off = r_mid},
        {.kind = SLIME_OP_WRITE, .ep = r->ep[1], .len = PATHS_MID, .local = mid.mr, .remote = &d, .remote_off = w_mid},
        {.kind = SLIME_OP_WRITE_IMM, .ep = r->ep[1], .len = PATHS_BIG, .local = big.mr, .remote = &d,
         .remote_off = w_big, .imm = 77},
    };
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_batch(r->ctx, ops, sizeof ops / sizeof ops[0], &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(in.base, PATHS_BIG, SEED_TARGET, r_big);
    H_CHECK_PATTERN(in.base + PATHS_BIG, PATHS_MID, SEED_TARGET, r_mid);
    h_ctl_send_u64(r, 1, 1);
    region_check_guards(&in, 0);
    region_free(&mid);
    region_free(&tiny);
    region_free(&big);
    region_free(&in);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"read_offsets", case_read_offsets, 2, false, 0},
        {"write_offsets", case_write_offsets, 2, false, 0},
        {"large", case_large, 2, false, 0},
        {"write_imm", case_write_imm, 2, false, 0},
        {"batch", case_batch, 2, false, 0},
        {"batch_runs", case_batch_runs, 2, false, 0},
        {"concurrent_writers", case_concurrent_writers, 3, false, 0},
        {"threads_large", case_threads_large, 2, false, 0},
        {"size_paths", case_size_paths, 2, false, 0},
    };
    return h_main("test_onesided", cases, sizeof cases / sizeof cases[0],
                  argc, argv);
}
