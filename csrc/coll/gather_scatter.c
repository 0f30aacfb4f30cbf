/* gather and scatter: direct.  The root posts all its receives (sends)
 * at once and the transport overlaps them; every other rank sends
 * (receives) one block.  The root's blocks are op->ptrs, one address per
 * rank (a list of tensors, no flat staging); the flat forms spell out
 * the blocks of one buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

static bool gather_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    if (op->bytes == 0) return true;
    r->phase = "direct";
    if (c->rank != op->root) return run_send_sync(r, op->root, 0, op->src, op->bytes) >= 0;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && run_recv(r, q, 0, op->ptrs[q], op->bytes) < 0) return false;
    void *mine = op->ptrs[c->rank];
    if (op->src != mine) memcpy(mine, op->src, op->bytes);
    return true; /* the worker waits for them */
}

static bool scatter_exec(coll_run_t *r, const coll_op_t *op) {
    slime_comm_t *c = r->comm;
    if (op->bytes == 0) return true;
    r->phase = "direct";
    if (c->rank != op->root) return run_recv(r, op->root, 0, op->dst, op->bytes) >= 0;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && run_send_sync(r, q, 0, op->ptrs[q], op->bytes) < 0) return false;
    const void *mine = op->ptrs[c->rank];
    if (mine != op->dst) memcpy(op->dst, mine, op->bytes);
    return true;
}

/* The checks all four entry points share; the root's block array is
 * checked and copied into t->ptrs (NULL elsewhere, or with 0 bytes). */
static slime_status_t check(slime_comm_t *comm, const char *name, const void *mine, size_t bytes,
                            const void *const *blocks, int root, slime_req_t **out, bool gather, coll_op_t *t) {
    t->ptrs = NULL;
    slime_status_t st = coll_check(comm, out, name, true, root);
    if (st != SLIME_OK) return st;
    if (bytes > SIZE_MAX / (size_t)comm->size)
        return slime_errorf(SLIME_ERR_INVAL, "%s: %d x %zu bytes overflow", name, comm->size, bytes);
    if (!bytes) return SLIME_OK;
    bool root_here = comm->rank == root;
    /* gather: src everywhere, blocks at the root; scatter: dst everywhere */
    if (!mine)
        return slime_errorf(SLIME_ERR_INVAL, "%s: NULL %s buffer with %zu bytes", name, gather ? "src" : "dst", bytes);
    if (!root_here) return SLIME_OK;
    return coll_copy_blocks(name, gather ? "dst block" : "src block", blocks, comm->size, bytes, "bytes",
                            t->ptrs_small, &t->ptrs);
}

slime_status_t slime_gather_ptrs(slime_comm_t *comm, const void *src, size_t bytes, void *const *dst_blocks,
                                 int root, slime_req_t **out) {
    coll_op_t t = {.exec = gather_exec, .name = "gather", .src = src, .bytes = bytes, .root = root};
    slime_status_t st = check(comm, "gather", src, bytes, (const void *const *)dst_blocks, root, out, true, &t);
    if (st != SLIME_OK) return st;
    return coll_post(comm, &t, out);
}

slime_status_t slime_scatter_ptrs(slime_comm_t *comm, const void *const *src_blocks, size_t bytes, void *dst,
                                  int root, slime_req_t **out) {
    coll_op_t t = {.exec = scatter_exec, .name = "scatter", .dst = dst, .bytes = bytes, .root = root};
    slime_status_t st = check(comm, "scatter", dst, bytes, src_blocks, root, out, false, &t);
    if (st != SLIME_OK) return st;
    return coll_post(comm, &t, out);
}

/* A flat root buffer (size * bytes) as its blocks; only the root has one. */
static const void **root_blocks(slime_comm_t *comm, const char *name, const char *what, const void *flat,
                                size_t bytes, int root, const void **small, slime_status_t *st) {
    *st = SLIME_OK;
    if (!comm || root != comm->rank || !bytes) return NULL;
    if (!flat) {
        *st = slime_errorf(SLIME_ERR_INVAL, "%s: NULL %s buffer with %zu bytes", name, what, bytes);
        return NULL;
    }
    if (bytes > SIZE_MAX / (size_t)comm->size) return NULL; /* check() says so */
    const void **b = coll_flat_blocks(flat, comm->size, bytes, small);
    if (!b) *st = SLIME_ERR_NOMEM;
    return b;
}

slime_status_t slime_gather(slime_comm_t *comm, const void *src, size_t bytes, void *dst, int root,
                            slime_req_t **out) {
    slime_status_t st;
    const void *small[COLL_BLOCKS_SMALL];
    const void **blocks = root_blocks(comm, "gather", "dst", dst, bytes, root, small, &st);
    if (st == SLIME_OK) st = slime_gather_ptrs(comm, src, bytes, (void *const *)blocks, root, out);
    else if (out) *out = NULL;
    coll_blocks_free(blocks, small);
    return st;
}

slime_status_t slime_scatter(slime_comm_t *comm, const void *src, size_t bytes, void *dst, int root,
                             slime_req_t **out) {
    slime_status_t st;
    const void *small[COLL_BLOCKS_SMALL];
    const void **blocks = root_blocks(comm, "scatter", "src", src, bytes, root, small, &st);
    if (st == SLIME_OK) st = slime_scatter_ptrs(comm, blocks, bytes, dst, root, out);
    else if (out) *out = NULL;
    coll_blocks_free(blocks, small);
    return st;
}
