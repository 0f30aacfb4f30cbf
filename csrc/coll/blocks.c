/* Per-block buffer arrays of the *_ptrs collectives: checked and copied
 * for the queued op (the caller's array may go once the call returns),
 * and the flat forms' blocks spelled out as such an array. */
#include <stdint.h>
#include <stdlib.h>

#include "coll/coll.h"

slime_status_t coll_copy_blocks(const char *name, const char *what, const void *const *blocks, int n,
                                size_t amount, const char *unit, void **small, void ***copy) {
    *copy = NULL;
    if (!amount) return SLIME_OK; /* nothing moves: the array is ignored */
    if (!blocks) return slime_errorf(SLIME_ERR_INVAL, "%s: NULL %s array", name, what);
    for (int q = 0; q < n; q++)
        if (!blocks[q])
            return slime_errorf(SLIME_ERR_INVAL, "%s: NULL %s for rank %d with %zu %s", name, what, q, amount, unit);
    void **c = n <= COLL_BLOCKS_SMALL ? small : malloc((size_t)n * sizeof *c);
    if (!c) return slime_errorf(SLIME_ERR_NOMEM, "%s: out of memory", name);
    /* const dropped for storage only: source blocks are never written */
    for (int q = 0; q < n; q++) c[q] = (void *)(uintptr_t)blocks[q];
    *copy = c;
    return SLIME_OK;
}

const void **coll_flat_blocks(const void *base, int n, size_t stride, const void **small) {
    const void **b = n <= COLL_BLOCKS_SMALL ? small : malloc((size_t)n * sizeof *b);
    if (!b) {
        (void)slime_errorf(SLIME_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int q = 0; q < n; q++) b[q] = base && stride ? (const uint8_t *)base + (size_t)q * stride : base;
    return b;
}

void coll_blocks_free(const void *blocks, const void *small) {
    if (blocks != small) free((void *)(uintptr_t)blocks);
}
