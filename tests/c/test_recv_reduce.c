/*
 * test_recv_reduce.c - slime_recv_reduce, the receive that reduces its
 * payload into the buffer: every dtype with every op that applies, eager
 * and rendezvous sizes, posted before the message or after it arrived,
 * checked element by element against the reference of test_coll_util.h
 * (rank 1's buffer holds rank 1's input, rank 0 sends rank 0's).
 *
 * main() shrinks the shm ring to 300007 bytes (299968, in whole lines)
 * written and read in odd 4099-byte pieces, and every message follows a skew message of 1 to
 * 7 bytes, so that payloads start at every offset of the ring, wrap at
 * odd offsets and arrive in pieces that split elements: the paths that
 * carry a split element over and that fold from unaligned bytes.  On tcp
 * the kernel splits the stream where it likes.  Also: allreduce through
 * the same small pieces, and messages that are not a whole number of
 * elements or too long fail the receive (and a rendezvous send) with the
 * buffer untouched, the stream still usable after them.
 */
#include "test_coll_util.h"

#define TAG_SKEW 10
#define TAG_DATA 11
#define SPARE 5 /* elements past the message that must stay as they were */

/* The reference of a fold: AVG folds as SUM (dividing is the caller's). */
static slime_redop_t folded_as(slime_redop_t op)
{
    return op == SLIME_RED_AVG ? SLIME_RED_SUM : op;
}

/* One message of count elements of dt from rank 0, folded with op into
 * rank 1's input; recv_first: rank 1 posts before rank 0 sends (the
 * payload streams into the posted receive), else after it arrived. */
static void fold_one(h_rank_t *r, slime_dtype_t dt, slime_redop_t op, size_t count, bool recv_first, int turn)
{
    slime_ep_t *ep = r->ep[h_peer(r)];
    const size_t es = slime_dtype_size(dt);
    const size_t skew = 1 + (size_t)turn % 7;
    uint8_t skew_buf[8] = {0};
    slime_req_t *req = NULL, *sreq = NULL;
    if (r->rank == 0) {
        uint8_t *src = h_alloc(count * es + 1);
        t_fill_input(dt, op, 0, src, count);
        if (recv_first) (void)h_ctl_recv_u64(r, 1);
        H_CHECK_OK(slime_send(ep, skew_buf, skew, TAG_SKEW, &sreq));
        H_CHECK_OK(slime_send(ep, src, count * es, TAG_DATA, &req));
        if (!recv_first) h_ctl_send_u64(r, 1, 1);
        H_WAIT_FREE(sreq, SLIME_OK);
        H_WAIT_FREE(req, SLIME_OK);
        free(src);
        return;
    }
    uint8_t *dst = h_alloc((count + SPARE) * es);
    t_fill_input(dt, op, 1, dst, count + SPARE);
    H_CHECK_OK(slime_recv(ep, skew_buf, sizeof skew_buf, TAG_SKEW, &sreq));
    if (recv_first) {
        H_CHECK_OK(slime_recv_reduce(ep, dst, count + SPARE, dt, op, TAG_DATA, &req));
        h_ctl_send_u64(r, 0, 1);
    } else {
        (void)h_ctl_recv_u64(r, 0);
        h_sleep_ms(2); /* an eager message lands unexpected, a large one's announcement */
        H_CHECK_OK(slime_recv_reduce(ep, dst, count + SPARE, dt, op, TAG_DATA, &req));
    }
    H_WAIT(sreq, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(sreq), skew);
    slime_req_free(sreq);
    H_WAIT(req, SLIME_OK);
    H_CHECK_EQ(slime_req_bytes(req), count * es);
    slime_req_free(req);
    t_check_reduced("recv_reduce", dt, folded_as(op), 2, dst, 0, count);
    for (size_t i = count; i < count + SPARE; i++)
        H_CHECK_EQ(t_get_bits(dt, dst, i), t_input(dt, op, 1, i));
    free(dst);
}

/* Every dtype and op at sizes from one element to past the ring, over
 * the dtypes [d0, d1) (the matrix is split so each case stays short
 * under the sanitizers). */
static void fold_matrix(h_rank_t *r, size_t d0, size_t d1)
{
    int turn = 0;
    for (size_t d = d0; d < d1; d++) {
        slime_dtype_t dt = t_dtypes[d];
        const size_t es = slime_dtype_size(dt);
        /* eager ones, and rendezvous ones that wrap the small ring */
        const size_t counts[] = {1, 7, 4099 / es + 3, 65536 / es + 1, 700 * H_KIB / es + 3};
        for (size_t o = 0; o < T_NOPS; o++) {
            slime_redop_t op = t_ops[o];
            if (!t_applies(op, dt)) continue;
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                fold_one(r, dt, op, counts[c], true, turn++);
                fold_one(r, dt, op, counts[c], false, turn++);
            }
        }
    }
}

static void fold_ints(h_rank_t *r) { fold_matrix(r, 0, 5); }
static void fold_floats(h_rank_t *r) { fold_matrix(r, 5, T_NDTYPES); }

/* Through the pieces and wraps above, the ring's reduce steps fold with
 * slime_recv_reduce: allreduce results against the reference. */
static void allreduce_split(h_rank_t *r)
{
    slime_comm_t *comm = t_comm(r, T_COMM_ID, H_WAIT_MS);
    const slime_dtype_t dts[] = {SLIME_DT_FLOAT32, SLIME_DT_FLOAT16, SLIME_DT_INT64, SLIME_DT_UINT8};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        slime_dtype_t dt = dts[d];
        size_t es = slime_dtype_size(dt), count = 3 * H_MIB / es + 7;
        slime_redop_t op = dt == SLIME_DT_FLOAT16 ? SLIME_RED_AVG : SLIME_RED_SUM;
        uint8_t *buf = h_alloc(count * es);
        t_fill_input(dt, op, r->rank, buf, count);
        T_RUN(slime_allreduce(comm, buf, count, dt, op, &q_));
        t_check_reduced("allreduce", dt, op, r->nranks, buf, 0, count);
        free(buf);
    }
    slime_comm_destroy(comm);
}

/* A message the receive cannot fold fails it and leaves the buffer as it
 * was; the next message folds as usual. */
static void refused(h_rank_t *r)
{
    slime_ep_t *ep = r->ep[h_peer(r)];
    const size_t big = 100000; /* int32 elements: by rendezvous */
    /* eager 6 bytes, rendezvous big * 4 + 2 bytes: not whole int32s;
     * then more elements than the receive holds, eager and rendezvous */
    const size_t lens[] = {6, big * 4 + 2, 12, (big + 1) * 4};
    const slime_status_t want[] = {SLIME_ERR_INVAL, SLIME_ERR_INVAL, SLIME_ERR_TRUNCATED, SLIME_ERR_TRUNCATED};
    const size_t caps[] = {big, big + 1, 2, big};
    for (size_t k = 0; k < 4; k++) {
        slime_req_t *req = NULL;
        if (r->rank == 0) {
            uint8_t *src = h_alloc(lens[k]);
            (void)h_ctl_recv_u64(r, 1);
            H_CHECK_OK(slime_send(ep, src, lens[k], TAG_DATA, &req));
            /* a rendezvous send learns that the receiver refused it */
            H_WAIT_FREE(req, lens[k] > 65536 ? want[k] : SLIME_OK);
            free(src);
            continue;
        }
        int32_t *dst = h_alloc((big + 1) * 4);
        t_fill_input(SLIME_DT_INT32, SLIME_RED_SUM, 1, dst, big + 1);
        H_CHECK_OK(slime_recv_reduce(ep, dst, caps[k], SLIME_DT_INT32, SLIME_RED_SUM, TAG_DATA, &req));
        h_ctl_send_u64(r, 0, 1);
        H_WAIT_FREE(req, want[k]);
        for (size_t i = 0; i < big + 1; i++)
            H_CHECK_EQ(t_get_bits(SLIME_DT_INT32, dst, i), t_input(SLIME_DT_INT32, SLIME_RED_SUM, 1, i));
        free(dst);
    }
    fold_one(r, SLIME_DT_INT32, SLIME_RED_SUM, big + 3, true, 3);
    /* argument errors: nothing is posted */
    if (r->rank == 1) {
        slime_req_t *req = NULL;
        int64_t x[2] = {0};
        H_CHECK_STATUS(slime_recv_reduce(ep, x, 2, SLIME_DT_INT64, SLIME_RED_AVG, TAG_DATA, &req), SLIME_ERR_UNSUPPORTED);
        H_CHECK(req == NULL);
        H_CHECK_STATUS(slime_recv_reduce(ep, (uint8_t *)x + 1, 1, SLIME_DT_INT32, SLIME_RED_SUM, TAG_DATA, &req),
                       SLIME_ERR_INVAL);
        H_CHECK_STATUS(slime_recv_reduce(ep, NULL, 1, SLIME_DT_INT32, SLIME_RED_SUM, TAG_DATA, &req), SLIME_ERR_INVAL);
        H_CHECK(req == NULL);
    }
}

int main(int argc, char **argv)
{
    /* before any context exists: every connection of every case */
    setenv("DLSLIME_SHM_RING", "300007", 1);
    setenv("DLSLIME_SHM_CHUNK", "4099", 1);
    static const h_case_t cases[] = {
        {"fold_ints", fold_ints, 2, false, 0},
        {"fold_floats", fold_floats, 2, false, 0},
        {"allreduce_split", allreduce_split, 2, false, 0},
        {"refused", refused, 2, false, 0},
    };
    return h_main("test_recv_reduce", cases, sizeof cases / sizeof cases[0], argc, argv);
}
