/* The collectives a two-rank box carries (pairbox.c has the box).
 *
 * Each one cuts its bytes into messages of at most pairbox_cap() and
 * numbers them from the communicator's box_seq, the same on both ranks.
 * An exchange (allreduce, allgather, reduce_scatter, barrier) writes its
 * part of message seq, reads the peer's and releases it before the next
 * one; a broadcast's root only writes, and runs ahead of the reader by
 * at most the ring of heads (small messages) or the two large buffers of
 * its side.  Either way a rank writes message seq
 * only after it released every earlier message it reads, the rule
 * pairbox_get counts on. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/reduce_kernels.h"

bool pairbox_allreduce(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const size_t es = slime_dtype_size(op->dtype);
    const size_t piece = pairbox_cap(c) / es; /* elements a message carries */
    uint8_t *buf = op->buf;
    r->phase = "shared box";
    for (size_t done = 0; done < op->count; done += piece) {
        size_t n = min_sz(op->count - done, piece), bytes = n * es;
        uint8_t *at = buf + done * es;
        uint64_t seq = ++c->box_seq;
        if (!pairbox_put(r, seq, at, bytes, op->count * es)) return false;
        const uint8_t *in = pairbox_get(r, seq, bytes, op->count * es);
        if (!in) return false;
        /* both ranks combine rank 0's data first: the same bits at both */
        if (c->rank == 0) red_accumulate(op->dtype, op->redop, at, in, n);
        else red_accumulate_swapped(op->dtype, op->redop, at, in, n);
        pairbox_release(c, seq);
    }
    if (op->redop == SLIME_RED_AVG) red_divide(op->dtype, buf, op->count, 2);
    p2p_count_box_op(c->ctx);
    return true;
}

/* The root writes, the other reads: the root is done once its last
 * message is in the box, as an eager send is. */
bool pairbox_broadcast(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const size_t cap = pairbox_cap(c);
    const bool root = c->rank == op->root;
    uint8_t *buf = op->buf;
    r->phase = "shared box";
    for (size_t done = 0; done < op->bytes; done += cap) {
        size_t len = min_sz(op->bytes - done, cap);
        uint64_t seq = ++c->box_seq;
        if (root) {
            if (!pairbox_put(r, seq, buf + done, len, op->bytes)) return false;
            continue;
        }
        const uint8_t *in = pairbox_get(r, seq, len, op->bytes);
        if (!in) return false;
        memcpy(buf + done, in, len);
        pairbox_release(c, seq);
    }
    p2p_count_box_op(c->ctx);
    return true;
}

/* op->ptrs: the two blocks of the result, ours from op->src */
bool pairbox_allgather(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const size_t cap = pairbox_cap(c);
    uint8_t *const *blocks = (uint8_t *const *)op->ptrs;
    uint8_t *mine = blocks[c->rank], *other = blocks[1 - c->rank];
    /* first, as the ring does: src may overlap either block */
    if ((const uint8_t *)op->src != mine) memmove(mine, op->src, op->bytes);
    r->phase = "shared box";
    for (size_t done = 0; done < op->bytes; done += cap) {
        size_t len = min_sz(op->bytes - done, cap);
        uint64_t seq = ++c->box_seq;
        if (!pairbox_put(r, seq, mine + done, len, op->bytes)) return false;
        const uint8_t *in = pairbox_get(r, seq, len, op->bytes);
        if (!in) return false;
        memcpy(other + done, in, len);
        pairbox_release(c, seq);
    }
    p2p_count_box_op(c->ctx);
    return true;
}

/* op->ptrs: the two src blocks.  Each rank sends the block the peer
 * ends with and combines the peer's part of its own into dst, rank 0's
 * data first as allreduce does.  dst may overlap a src block (in place):
 * then the result is made in scratch and copied at the end. */
bool pairbox_reduce_scatter(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const size_t es = slime_dtype_size(op->dtype), total = op->count * es;
    const size_t piece = pairbox_cap(c) / es;
    const uint8_t *const *src = (const uint8_t *const *)op->ptrs;
    const uint8_t *own = src[c->rank], *theirs = src[1 - c->rank];
    uint8_t *out = op->dst;
    if (coll_overlaps(out, own, total) || coll_overlaps(out, theirs, total)) {
        out = comm_scratch(c, total);
        if (!out) return run_fail(r, SLIME_ERR_NOMEM, "out of memory for %zu bytes of scratch", total);
    }
    r->phase = "shared box";
    for (size_t done = 0; done < op->count; done += piece) {
        size_t n = min_sz(op->count - done, piece), at = done * es;
        uint64_t seq = ++c->box_seq;
        if (!pairbox_put(r, seq, theirs + at, n * es, total)) return false;
        const uint8_t *in = pairbox_get(r, seq, n * es, total);
        if (!in) return false;
        if (c->rank == 0) red_combine(op->dtype, op->redop, out + at, own + at, in, n);
        else red_combine(op->dtype, op->redop, out + at, in, own + at, n);
        pairbox_release(c, seq);
    }
    if (op->redop == SLIME_RED_AVG) red_divide(op->dtype, out, op->count, 2);
    if (out != op->dst) memcpy(op->dst, out, total);
    p2p_count_box_op(c->ctx);
    return true;
}

/* A message with no data each way. */
bool pairbox_barrier(coll_run_t *r) {
    slime_comm_t *c = r->comm;
    uint64_t seq = ++c->box_seq;
    r->phase = "shared box";
    if (!pairbox_put(r, seq, NULL, 0, 0) || !pairbox_get(r, seq, 0, 0)) return false;
    pairbox_release(c, seq);
    p2p_count_box_op(c->ctx);
    return true;
}
