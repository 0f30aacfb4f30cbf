/* Element-wise reductions, one loop per (dtype, op). */
#ifndef SLIME_COLL_REDUCE_KERNELS_H
#define SLIME_COLL_REDUCE_KERNELS_H

#include <stddef.h>

#include "dlslime/dlslime.h"

/* acc[i] = acc[i] op in[i].  AVG accumulates as SUM (see red_divide).
 * The two ranges must not overlap. */
void red_accumulate(slime_dtype_t dt, slime_redop_t op, void *acc, const void *in, size_t n);
/* acc[i] = in[i] op acc[i]: red_accumulate with the operands the other
 * way round, for a rank that must combine its partner's data first (so
 * that both end with the same bits: MIN and MAX of +0 and -0 follow the
 * order) */
void red_accumulate_swapped(slime_dtype_t dt, slime_redop_t op, void *acc, const void *in, size_t n);
/* out[i] = a[i] op b[i]; out overlaps neither input. */
void red_combine(slime_dtype_t dt, slime_redop_t op, void *out, const void *a, const void *b,
                 size_t n);
/* The loop red_accumulate runs for (dt, op), for a combining receive;
 * dt and op must have passed slime_redop_check. */
void (*red_accumulator(slime_dtype_t dt, slime_redop_t op))(void *acc, const void *in, size_t n);
/* AVG's last step: buf[i] /= divisor (floating types). */
void red_divide(slime_dtype_t dt, void *buf, size_t n, int divisor);

#endif
