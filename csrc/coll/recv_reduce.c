/* slime_recv_reduce: a receive whose payload is reduced into the buffer
 * (core/combine.c does the folding); here only the binding of a dtype and
 * an op to their reduction loop, which the core does not know. */
#include <stdint.h>

#include "coll/coll.h"
#include "coll/reduce_kernels.h"

slime_status_t slime_recv_reduce(slime_ep_t *ep, void *buf, size_t count, slime_dtype_t dtype, slime_redop_t op,
                                 uint64_t tag, slime_req_t **out) {
    if (out) *out = NULL;
    slime_status_t st = coll_check_reduce("recv_reduce", dtype, op);
    if (st != SLIME_OK) return st;
    size_t es = slime_dtype_size(dtype);
    if (count > SIZE_MAX / es) return slime_errorf(SLIME_ERR_INVAL, "recv_reduce: %zu elements overflow", count);
    if (!buf && count) return slime_errorf(SLIME_ERR_INVAL, "recv_reduce: NULL buffer of %zu elements", count);
    if ((uintptr_t)buf % es)
        return slime_errorf(SLIME_ERR_INVAL, "recv_reduce: buffer %p is not aligned for %s", buf, dtype_name(dtype));
    if (!out) return slime_errorf(SLIME_ERR_INVAL, "recv_reduce: NULL request pointer");
    recv_opts_t o = {.combine = red_accumulator(dtype, op), .esize = es};
    return p2p_recv(ep, buf, count * es, tag, &o, out);
}
