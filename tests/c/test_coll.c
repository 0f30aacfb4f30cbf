/*
 * test_coll.c - allreduce on 1 to 4 ranks: every dtype with every op that
 * applies, sizes from none to several MiB (both the recursive-doubling
 * and the pipelined ring paths, with odd splits), checked element by
 * element against a reference each rank computes; floats that do not
 * add exactly (two ranks: one rounding, as Gloo; three: the same bits on
 * every rank); NaN; many collectives in flight back to back.
 */
#include "test_coll_util.h"

#include <float.h>

/* Counts that take each path: none, tiny, odd, and above the 64 KiB
 * latency threshold (ring, blocks not a multiple of anything). */
static size_t ring_count(slime_dtype_t dt)
{
    return (96 * H_KIB) / slime_dtype_size(dt) + 3;
}

/* full: every size; else only those that take the ring. */
static void matrix_run(h_rank_t *r, bool full)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    for (size_t d = 0; d < T_NDTYPES; d++) {
        slime_dtype_t dt = t_dtypes[d];
        const size_t all[] = {0, 1, 7, 1001, ring_count(dt)};
        const size_t *counts = full ? all : all + 4;
        const size_t ncounts = full ? 5 : 1;
        for (size_t o = 0; o < T_NOPS; o++) {
            slime_redop_t op = t_ops[o];
            if (!t_applies(op, dt)) {
                slime_req_t *q = NULL;
                uint8_t b[8] = {0};
                H_CHECK_STATUS(slime_allreduce(comm, b, 1, dt, op, &q), SLIME_ERR_UNSUPPORTED);
                H_CHECK(q == NULL);
                continue;
            }
            for (size_t c = 0; c < ncounts; c++)
                t_allreduce_checked(comm, r->nranks, r->rank, dt, op, counts[c]);
        }
    }
    /* several MiB: many chunks per block, the last one short */
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 3 * H_MIB / 4 + 12345);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_BFLOAT16, SLIME_RED_MAX, H_MIB + 77);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_INT64, SLIME_RED_BXOR, H_MIB / 2 + 1);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT64, SLIME_RED_AVG, H_MIB / 2 + 5);
    slime_comm_destroy(comm);
}

static void matrix(h_rank_t *r)
{
    matrix_run(r, true);
}

/* The same with small pipeline knobs (they must match on every rank, and
 * each case runs in fresh processes): tiny chunks, and chunks that move
 * by one-sided reads on shm links from 64 KiB up, so that every path of
 * the ring runs with many chunks per block.  Plus one buffer above the
 * default read threshold, with the default knobs. */
static void matrix_small_chunks(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 5 * H_MIB / 4 + 3);
    slime_comm_destroy(comm);
    setenv("DLSLIME_COLL_CHUNK", "8192", 1);
    setenv("DLSLIME_COLL_CMA_MIN", "65536", 1);
    setenv("DLSLIME_COLL_CMA_COPY_MIN", "65536", 1);
    matrix_run(r, false);
}

static void matrix_no_reads(h_rank_t *r)
{
    setenv("DLSLIME_COLL_CMA", "0", 1);
    setenv("DLSLIME_COLL_CHUNK", "8192", 1);
    matrix_run(r, false);
}

/* Arbitrary (not integer) floats of rank's stream, index i. */
static double t_real(int rank, size_t i)
{
    uint64_t h = t_mix(((uint64_t)rank << 40) ^ (i * 0x2545f4914f6cdd1dull) ^ 0x5555);
    double unit = (double)(h >> 11) * 0x1p-53; /* [0, 1) */
    int exp = (int)((h >> 3) & 7) - 3;
    return ldexp(unit * 2.0 - 1.0, exp);
}

/* Two ranks: each element is a + b rounded once in the type (for the
 * half types: in float, then to the half type, as torch's Half does). */
static void exact_two(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const slime_dtype_t dts[] = {SLIME_DT_FLOAT32, SLIME_DT_FLOAT64, SLIME_DT_FLOAT16, SLIME_DT_BFLOAT16};
    const size_t counts[] = {5, 3001, 200 * H_KIB + 1};
    for (size_t d = 0; d < 4; d++) {
        slime_dtype_t dt = dts[d];
        size_t es = slime_dtype_size(dt);
        for (size_t c = 0; c < 3; c++) {
            size_t count = counts[c];
            uint8_t *buf = h_alloc(count * es);
            for (size_t i = 0; i < count; i++) {
                double v = t_real(r->rank, i);
                if (dt == SLIME_DT_FLOAT16 || dt == SLIME_DT_BFLOAT16)
                    v = t_half_round(dt, v);
                t_set_float(dt, buf, i, v);
            }
            T_RUN(slime_allreduce(comm, buf, count, dt, SLIME_RED_SUM, &q_));
            for (size_t i = 0; i < count; i++) {
                double a = t_real(0, i), b = t_real(1, i), want;
                if (dt == SLIME_DT_FLOAT64) {
                    want = a + b;
                } else if (dt == SLIME_DT_FLOAT32) {
                    want = (double)((float)a + (float)b);
                } else {
                    a = t_half_round(dt, a);
                    b = t_half_round(dt, b);
                    want = t_half_round(dt, (double)((float)a + (float)b));
                }
                double got = t_get_float(dt, buf, i);
                if (got != want)
                    h_fail(__FILE__, __LINE__, "%s count %zu element %zu: %.17g, want %.17g",
                           t_dtype_name(dt), count, i, got, want);
            }
            free(buf);
        }
    }
    slime_comm_destroy(comm);
}

/* Every rank holds the very same bits in buf: a digest of them, compared
 * at rank 0. */
static void check_same_bits(h_rank_t *r, const float *buf, size_t count)
{
    uint64_t digest = 1469598103934665603ull;
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &buf[i], 4);
        digest = (digest ^ bits) * 1099511628211ull;
    }
    if (r->rank == 0) {
        for (int k = 1; k < r->nranks; k++)
            H_CHECK_EQ(h_ctl_recv_u64(r, k), digest);
    } else {
        h_ctl_send_u64(r, 0, digest);
    }
}

/* Three ranks, sums that round: every rank must hold the very same bits,
 * close to the exact sum. */
static void same_bits(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const size_t counts[] = {1000, 300 * H_KIB + 7};
    for (size_t c = 0; c < 2; c++) {
        size_t count = counts[c];
        float *buf = h_alloc(count * sizeof *buf);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)t_real(r->rank, i);
        T_RUN(slime_allreduce(comm, buf, count, SLIME_DT_FLOAT32, SLIME_RED_SUM, &q_));
        for (size_t i = 0; i < count; i++) {
            double exact = 0, mag = 0;
            for (int k = 0; k < r->nranks; k++) {
                exact += (double)(float)t_real(k, i);
                mag += fabs((double)(float)t_real(k, i));
            }
            if (fabs((double)buf[i] - exact) > 4 * FLT_EPSILON * mag)
                h_fail(__FILE__, __LINE__, "element %zu: %.9g, exact %.9g", i, (double)buf[i], exact);
        }
        check_same_bits(r, buf, count);
        free(buf);
    }
    slime_comm_destroy(comm);
}

/* NaN wins MIN and MAX wherever one rank has it. */
static void nan_wins(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const slime_redop_t ops[] = {SLIME_RED_MIN, SLIME_RED_MAX};
    const size_t counts[] = {9, 100 * H_KIB};
    for (size_t o = 0; o < 2; o++) {
        for (size_t c = 0; c < 2; c++) {
            size_t count = counts[c];
            float *buf = h_alloc(count * sizeof *buf);
            for (size_t i = 0; i < count; i++)
                buf[i] = (float)(r->rank + (int)(i % 5));
            if (r->rank == r->nranks - 1) {
                buf[3] = NAN;
                buf[count - 1] = NAN;
            }
            T_RUN(slime_allreduce(comm, buf, count, SLIME_DT_FLOAT32, ops[o], &q_));
            for (size_t i = 0; i < count; i++) {
                if (i == 3 || i == count - 1) {
                    H_CHECK(isnan(buf[i]));
                    continue;
                }
                float want = ops[o] == SLIME_RED_MIN ? (float)(i % 5) : (float)(r->nranks - 1 + (int)(i % 5));
                H_CHECK(buf[i] == want);
            }
            free(buf);
        }
    }
    slime_comm_destroy(comm);
}

/* MIN and MAX of +0 and -0 depend on the operands' order: every rank
 * must still hold the very same bits, whichever algorithm ran (the shared
 * box, recursive doubling, the ring). */
static void signed_zeros_agree(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const slime_redop_t ops[] = {SLIME_RED_MIN, SLIME_RED_MAX};
    const size_t counts[] = {9, 1000, 100 * H_KIB};
    for (size_t o = 0; o < 2; o++) {
        for (size_t c = 0; c < 3; c++) {
            size_t count = counts[c];
            float *buf = h_alloc(count * sizeof *buf);
            for (size_t i = 0; i < count; i++)
                buf[i] = (r->rank + (int)i) % 2 ? -0.0f : 0.0f;
            T_RUN(slime_allreduce(comm, buf, count, SLIME_DT_FLOAT32, ops[o], &q_));
            for (size_t i = 0; i < count; i++)
                H_CHECK(buf[i] == 0.0f);
            check_same_bits(r, buf, count);
            free(buf);
        }
    }
    slime_comm_destroy(comm);
}

/* Over tcp, a ring whose every receive is posted before its first send
 * sends its chunks eagerly, even past the eager size: no rendezvous.  A
 * ring of more chunks than its window keeps them.  (Over shm the rings
 * keep their rendezvous, which the receiver may fetch.) */
static void posted_chunks_eager(h_rank_t *r)
{
    bool tcp = strcmp(h_transport(), "tcp") == 0;
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    uint64_t before = slime_ctx_counter(r->ctx, SLIME_COUNTER_RENDEZVOUS);
    /* 1 MiB on 2 ranks: a chunk of 512 KiB a step, past tcp's 256 KiB */
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB / 4);
    uint64_t after_short = slime_ctx_counter(r->ctx, SLIME_COUNTER_RENDEZVOUS);
    if (tcp) H_CHECK_EQ(after_short, before);
    /* 16 MiB: eight 1 MiB chunks a step */
    t_allreduce_checked(comm, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, 4 * H_MIB);
    if (tcp) H_CHECK(slime_ctx_counter(r->ctx, SLIME_COUNTER_RENDEZVOUS) > after_short);
    slime_comm_destroy(comm);
}

/* Every rank must cut a ring's chunks alike, though each sees only its
 * own links (read_links_agreed, coll/ring.c).  With rank 0 on tcp alone
 * and the others free to pick, ranks 1-3 reach each other by shm: rank
 * 2's two links could read, its neighbours' could not.  A 4 MiB
 * allreduce, past the size where reading rings cut chunks of their own,
 * must come out right on every rank; so must one on the communicator of
 * ranks 1-3 alone, whose links all read where shm can. */
static void mixed_links(h_rank_t *r)
{
    slime_ctx_opts_t opts;
    slime_ctx_opts_init(&opts);
    opts.transport = r->rank == 0 ? "tcp" : "auto";
    slime_ctx_t *ctx = h_ctx_create(&opts);
    slime_ep_t *ep[H_MAX_RANKS] = {NULL};
    h_connect_all(r, ctx, ep);
    for (int k = 0; k < r->nranks; k++)
        if (k != r->rank && (k == 0 || r->rank == 0))
            H_CHECK_EQ(strcmp(slime_ep_transport(ep[k]), "tcp"), 0);
    slime_comm_t *all = NULL, *shm_three = NULL;
    H_CHECK_OK(slime_comm_create(ctx, T_COMM_ID, 1, r->rank, r->nranks, ep, H_WAIT_MS, &all));
    t_allreduce_checked(all, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB);
    t_allreduce_checked(all, r->nranks, r->rank, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB);
    slime_comm_destroy(all);
    if (r->rank > 0) {
        H_CHECK_OK(slime_comm_create(ctx, T_COMM_ID + 1, 1, r->rank - 1, r->nranks - 1, ep + 1, H_WAIT_MS,
                                     &shm_three));
        t_allreduce_checked(shm_three, r->nranks - 1, r->rank - 1, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB);
        slime_comm_destroy(shm_three);
    }
    h_barrier(r);
    slime_ctx_destroy(ctx);
}

/* Many collectives posted before any is waited for: they run in order
 * and none takes another's messages. */
static void back_to_back(h_rank_t *r)
{
    enum { N = 120 };
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    slime_req_t *reqs[N];
    int32_t *bufs[N];
    size_t counts[N];
    for (int k = 0; k < N; k++) {
        counts[k] = (k % 3 == 2) ? 20000 + (size_t)k : 1 + (size_t)k * 3;
        bufs[k] = h_alloc(counts[k] * sizeof(int32_t));
        for (size_t i = 0; i < counts[k]; i++)
            bufs[k][i] = (int32_t)(k * 1000 + r->rank * 10 + (int)(i % 7));
        reqs[k] = NULL;
        H_CHECK_OK(slime_allreduce(comm, bufs[k], counts[k], SLIME_DT_INT32, SLIME_RED_SUM, &reqs[k]));
    }
    /* waited for from the last: all must be done by then */
    for (int k = N - 1; k >= 0; k--) {
        H_WAIT(reqs[k], SLIME_OK);
        slime_req_free(reqs[k]);
        int n = r->nranks;
        for (size_t i = 0; i < counts[k]; i++) {
            int32_t want = (int32_t)(n * (k * 1000 + (int)(i % 7)) + 10 * n * (n - 1) / 2);
            if (bufs[k][i] != want)
                h_fail(__FILE__, __LINE__, "collective %d element %zu: %d, want %d", k, i, bufs[k][i], want);
        }
        free(bufs[k]);
    }
    /* a request freed before it completes still runs its collective */
    int32_t x = r->rank + 1;
    slime_req_t *q = NULL;
    H_CHECK_OK(slime_allreduce(comm, &x, 1, SLIME_DT_INT32, SLIME_RED_SUM, &q));
    slime_req_free(q);
    T_RUN(slime_barrier(comm, &q_));
    int32_t y = 5;
    T_RUN(slime_allreduce(comm, &y, 1, SLIME_DT_INT32, SLIME_RED_SUM, &q_));
    H_CHECK_EQ(y, 5 * r->nranks);
    H_CHECK_EQ(x, r->nranks * (r->nranks + 1) / 2);
    slime_comm_destroy(comm);
}

/* Two communicators over the same endpoints do not mix their traffic. */
static void two_comms(h_rank_t *r)
{
    /* a timeout meaning "forever" must not overflow into "at once" */
    slime_comm_t *a = t_comm(r, 1, INT64_MAX), *b = t_comm(r, 2, 1);
    H_CHECK_OK(slime_comm_set_timeout(b, H_WAIT_MS));
    enum { COUNT = 50000 };
    int32_t *x = h_alloc(COUNT * 4), *y = h_alloc(COUNT * 4);
    for (int i = 0; i < COUNT; i++) {
        x[i] = r->rank + i;
        y[i] = 2 * r->rank;
    }
    slime_req_t *qa = NULL, *qb = NULL;
    /* opposite orders on different ranks */
    if (r->rank % 2) {
        H_CHECK_OK(slime_allreduce(a, x, COUNT, SLIME_DT_INT32, SLIME_RED_SUM, &qa));
        H_CHECK_OK(slime_allreduce(b, y, COUNT, SLIME_DT_INT32, SLIME_RED_MAX, &qb));
    } else {
        H_CHECK_OK(slime_allreduce(b, y, COUNT, SLIME_DT_INT32, SLIME_RED_MAX, &qb));
        H_CHECK_OK(slime_allreduce(a, x, COUNT, SLIME_DT_INT32, SLIME_RED_SUM, &qa));
    }
    H_WAIT_FREE(qa, SLIME_OK);
    H_WAIT_FREE(qb, SLIME_OK);
    int n = r->nranks;
    for (int i = 0; i < COUNT; i++) {
        H_CHECK_EQ(x[i], n * (n - 1) / 2 + n * i);
        H_CHECK_EQ(y[i], 2 * (n - 1));
    }
    free(x);
    free(y);
    slime_comm_destroy(a);
    slime_comm_destroy(b);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"matrix_1", matrix, 1, false, 0},
        {"matrix_2", matrix, 2, false, 0},
        {"matrix_3", matrix, 3, false, 0},
        {"matrix_4", matrix, 4, false, 0},
        {"small_chunks_2", matrix_small_chunks, 2, false, 0},
        {"small_chunks_3", matrix_small_chunks, 3, false, 0},
        {"no_reads_3", matrix_no_reads, 3, false, 0},
        {"exact_two", exact_two, 2, false, 0},
        {"same_bits_3", same_bits, 3, false, 0},
        {"nan_wins", nan_wins, 3, false, 0},
        {"signed_zeros_agree_2", signed_zeros_agree, 2, false, 0},
        {"signed_zeros_agree_4", signed_zeros_agree, 4, false, 0},
        {"posted_chunks_eager", posted_chunks_eager, 2, false, 0},
        {"mixed_links", mixed_links, 4, true, 0},
        {"back_to_back_2", back_to_back, 2, false, 0},
        {"back_to_back_3", back_to_back, 3, false, 0},
        {"two_comms", two_comms, 4, false, 0},
    };
    return h_main("test_coll", cases, sizeof cases / sizeof cases[0], argc, argv);
}
