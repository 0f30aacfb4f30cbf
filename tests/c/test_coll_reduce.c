/*
 * test_coll_reduce.c - reduce to every root and reduce_scatter on 1 to 4
 * ranks: every dtype with every op that applies, sizes through both
 * algorithms (tree / ring), checked against each rank's own reference.
 */
#include "test_coll_util.h"

static size_t big_count(slime_dtype_t dt)
{
    return (80 * H_KIB) / slime_dtype_size(dt) + 5;
}

static void reduce_one(slime_comm_t *comm, h_rank_t *r, slime_dtype_t dt, slime_redop_t op, size_t count,
                       int root)
{
    size_t es = slime_dtype_size(dt);
    uint8_t *buf = h_alloc(count * es + 1);
    t_fill_input(dt, op, r->rank, buf, count);
    T_RUN(slime_reduce(comm, count ? buf : NULL, count, dt, op, root, &q_));
    if (r->rank == root)
        t_check_reduced("reduce", dt, op, r->nranks, buf, 0, count);
    free(buf);
}

static void reduce_matrix_run(h_rank_t *r, bool full)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    int turn = 0;
    for (size_t d = 0; d < T_NDTYPES; d++) {
        slime_dtype_t dt = t_dtypes[d];
        const size_t all[] = {0, 1, 5, 999, big_count(dt)};
        const size_t *counts = full ? all : all + 4;
        const size_t ncounts = full ? 5 : 1;
        for (size_t o = 0; o < T_NOPS; o++) {
            slime_redop_t op = t_ops[o];
            if (!t_applies(op, dt))
                continue;
            for (size_t c = 0; c < ncounts; c++)
                reduce_one(comm, r, dt, op, counts[c], turn++ % r->nranks);
        }
    }
    for (int root = 0; root < r->nranks; root++)
        reduce_one(comm, r, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB / 2 + 333, root);
    reduce_one(comm, r, SLIME_DT_FLOAT16, SLIME_RED_AVG, H_MIB + 1, r->nranks - 1);
    slime_comm_destroy(comm);
}

static void reduce_matrix(h_rank_t *r)
{
    reduce_matrix_run(r, true);
}

/* rank's input block b (count elements) is the reference stream at
 * b * count, so that the expected block r is elements [r * count, +count). */
static void reduce_scatter_one(slime_comm_t *comm, h_rank_t *r, slime_dtype_t dt, slime_redop_t op,
                               size_t count)
{
    size_t es = slime_dtype_size(dt);
    size_t n = (size_t)r->nranks;
    uint8_t *src = h_alloc(n * count * es + 1), *dst = h_alloc(count * es + 1);
    t_fill_input(dt, op, r->rank, src, n * count);
    uint8_t *copy = h_alloc(n * count * es + 1);
    memcpy(copy, src, n * count * es);
    T_RUN(slime_reduce_scatter(comm, count ? src : NULL, count ? dst : NULL, count, dt, op, &q_));
    t_check_reduced("reduce_scatter", dt, op, r->nranks, dst, (size_t)r->rank * count, count);
    H_CHECK(memcmp(copy, src, n * count * es) == 0); /* src is left alone */
    /* the same from a buffer per block, allocated in reverse order (not
     * ascending in memory), into a dst with a guard byte after it */
    uint8_t *own[H_MAX_RANKS];
    const void *blocks[H_MAX_RANKS];
    for (int b = (int)n - 1; b >= 0; b--) {
        own[b] = h_alloc(count * es + 1);
        memcpy(own[b], copy + (size_t)b * count * es, count * es);
        blocks[b] = count ? own[b] : NULL;
    }
    memset(dst, 0xee, count * es + 1);
    T_RUN(slime_reduce_scatter_ptrs(comm, count ? blocks : NULL, count ? dst : NULL, count, dt, op, &q_));
    t_check_reduced("reduce_scatter_ptrs", dt, op, r->nranks, dst, (size_t)r->rank * count, count);
    H_CHECK_BYTES(dst + count * es, 1, 0xee);
    for (size_t b = 0; b < n; b++) {
        H_CHECK(memcmp(own[b], copy + b * count * es, count * es) == 0); /* blocks are left alone */
        free(own[b]);
    }
    free(copy);
    free(src);
    free(dst);
}

static void reduce_scatter_matrix(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    for (size_t d = 0; d < T_NDTYPES; d++) {
        slime_dtype_t dt = t_dtypes[d];
        const size_t counts[] = {0, 1, 3, 777, big_count(dt)};
        for (size_t o = 0; o < T_NOPS; o++) {
            slime_redop_t op = t_ops[o];
            if (!t_applies(op, dt)) {
                slime_req_t *q = NULL;
                uint8_t b[64] = {0};
                H_CHECK_STATUS(slime_reduce_scatter(comm, b, b + 32, 1, dt, op, &q), SLIME_ERR_UNSUPPORTED);
                H_CHECK(q == NULL);
                continue;
            }
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                reduce_scatter_one(comm, r, dt, op, counts[c]);
        }
    }
    /* many chunks per block, so that scratch slots are reused while
     * their partial sums are still being sent */
    reduce_scatter_one(comm, r, SLIME_DT_FLOAT32, SLIME_RED_SUM, H_MIB / 2 + 17);
    reduce_scatter_one(comm, r, SLIME_DT_BFLOAT16, SLIME_RED_AVG, H_MIB / 2 + 3);
    reduce_scatter_one(comm, r, SLIME_DT_INT16, SLIME_RED_PROD, H_MIB / 2);
    slime_comm_destroy(comm);
}

/* reduce's ring with chunks that move by one-sided reads on shm links */
static void reduce_small_chunks(h_rank_t *r)
{
    setenv("DLSLIME_COLL_CHUNK", "8192", 1);
    setenv("DLSLIME_COLL_CMA_MIN", "65536", 1);
    setenv("DLSLIME_COLL_CMA_COPY_MIN", "65536", 1);
    reduce_matrix_run(r, false);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"reduce_1", reduce_matrix, 1, false, 0},
        {"reduce_2", reduce_matrix, 2, false, 0},
        {"reduce_3", reduce_matrix, 3, false, 0},
        {"reduce_4", reduce_matrix, 4, false, 0},
        {"reduce_small_chunks_3", reduce_small_chunks, 3, false, 0},
        {"reduce_scatter_1", reduce_scatter_matrix, 1, false, 0},
        {"reduce_scatter_2", reduce_scatter_matrix, 2, false, 0},
        {"reduce_scatter_3", reduce_scatter_matrix, 3, false, 0},
        {"reduce_scatter_4", reduce_scatter_matrix, 4, false, 0},
    };
    return h_main("test_coll_reduce", cases, sizeof cases / sizeof cases[0], argc, argv);
}
