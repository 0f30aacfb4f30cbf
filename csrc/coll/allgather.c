/* allgather: the ring, copying.  Rank r's block starts in dst block r;
 * at step s each rank passes on the block it got at step s - 1, in
 * chunks, so n - 1 steps move every block to every rank.  Each block has
 * an address of its own, so that a list of tensors needs no flat
 * staging copy; the flat form names the blocks of one buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* Whether bytes at src overlap none of the n blocks of that size. */
static bool src_apart(const uint8_t *src, size_t bytes, uint8_t *const *blocks, int n) {
    for (int b = 0; b < n; b++)
        if (coll_overlaps(src, blocks[b], bytes)) return false;
    return true;
}

/* op->ptrs: the size block addresses */
static bool allgather_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    const int n = c->size;
    if (op->bytes == 0) return true;
    if (pairbox_usable(r, op->bytes)) return pairbox_allgather(r, op);
    if (!run_ok(r)) return false;
    uint8_t *const *blocks = (uint8_t *const *)op->ptrs;
    uint8_t *mine = blocks[c->rank];
    const uint8_t *src = op->src;
    /* apart from every block, src is sent from where it is, and copied
     * into its place meanwhile (ring_run); else first, by memmove, as it
     * may overlap its own block (in place, or nearly) or another */
    const uint8_t *own_src = n > 1 && src != mine && src_apart(src, op->bytes, blocks, n) ? src : NULL;
    if (src != mine && !own_src) memmove(mine, src, op->bytes);
    ring_plan_t p = {
        .mode = RING_INPLACE,
        .blocks = blocks,
        .own_src = own_src,
        .total = (size_t)n * op->bytes,
        .esize = 1,
        .shift = 0,
        .steps = n - 1,
        .reduce_steps = 0,
    };
    r->phase = "ring";
    return ring_run(r, &p);
}

/* The checks both entry points share: the communicator, the output
 * request, and n x bytes fitting in memory. */
static slime_status_t allgather_check(slime_comm_t *comm, slime_req_t **out, size_t bytes) {
    slime_status_t st = coll_check(comm, out, "allgather", false, 0);
    if (st == SLIME_OK && bytes > SIZE_MAX / (size_t)comm->size)
        st = slime_errorf(SLIME_ERR_INVAL, "allgather: %d x %zu bytes overflow", comm->size, bytes);
    return st;
}

/* The rest of the checks, and the post.  Each entry point runs
 * allgather_check once: a second coll_check would drop the caller's
 * slime_comm_next_waited, and the post would wake the worker. */
static slime_status_t allgather_post(slime_comm_t *comm, const void *src, size_t bytes, void *const *dst_blocks,
                                     slime_req_t **out) {
    if (bytes && !src) return slime_errorf(SLIME_ERR_INVAL, "allgather: NULL src buffer with %zu bytes", bytes);
    coll_op_t t = {.exec = allgather_exec, .name = "allgather", .src = src, .bytes = bytes};
    slime_status_t st = coll_copy_blocks("allgather", "dst block", (const void *const *)dst_blocks, comm->size,
                                         bytes, "bytes", t.ptrs_small, &t.ptrs);
    if (st != SLIME_OK) return st;
    return coll_post(comm, &t, out);
}

slime_status_t slime_allgather_ptrs(slime_comm_t *comm, const void *src, size_t bytes, void *const *dst_blocks,
                                    slime_req_t **out) {
    slime_status_t st = allgather_check(comm, out, bytes);
    return st == SLIME_OK ? allgather_post(comm, src, bytes, dst_blocks, out) : st;
}

slime_status_t slime_allgather(slime_comm_t *comm, const void *src, size_t bytes, void *dst,
                               slime_req_t **out) {
    slime_status_t st = allgather_check(comm, out, bytes);
    if (st != SLIME_OK) return st;
    if (bytes && !dst) return slime_errorf(SLIME_ERR_INVAL, "allgather: NULL dst buffer with %zu bytes", bytes);
    /* the same collective with each block's address spelled out */
    const void *small[COLL_BLOCKS_SMALL];
    const void **blocks = coll_flat_blocks(dst, comm->size, bytes, small);
    if (!blocks) return SLIME_ERR_NOMEM;
    st = allgather_post(comm, src, bytes, (void *const *)blocks, out);
    coll_blocks_free(blocks, small);
    return st;
}
