// dtype.h - torch dtypes and reduce ops as libdlslime sees them.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <dlslime/dlslime.h>

namespace dlslime_shim {

// The libdlslime dtype of a reduction's tensor; throws naming op and the
// dtype when the core has no arithmetic for it (complex, uint16, ...).
slime_dtype_t reduction_dtype(const at::Tensor& tensor, const char* op);

// The libdlslime reduce op; throws for PREMUL_SUM and anything newer.
slime_redop_t reduction_op(const c10d::ReduceOp& reduce_op, const char* op);

// Both of the above, then slime_redop_check: an op that does not apply
// to the dtype (BXOR on float32, AVG on int32) throws with the core's text.
struct Reduction {
  slime_dtype_t dtype;
  slime_redop_t op;
};
Reduction checked_reduction(const at::Tensor& tensor,
                            const c10d::ReduceOp& reduce_op, const char* op);

} // namespace dlslime_shim
