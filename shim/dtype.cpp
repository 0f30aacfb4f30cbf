// dtype.cpp - see dtype.h.
#include "dtype.h"

#include <string>

#include <c10/util/Exception.h>

namespace dlslime_shim {

namespace {

const char* reduce_op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNKNOWN";
  }
}

} // namespace

slime_dtype_t reduction_dtype(const at::Tensor& tensor, const char* op) {
  switch (tensor.scalar_type()) {
    case at::kChar: return SLIME_DT_INT8;
    case at::kByte: return SLIME_DT_UINT8;
    case at::kShort: return SLIME_DT_INT16;
    case at::kInt: return SLIME_DT_INT32;
    case at::kLong: return SLIME_DT_INT64;
    case at::kHalf: return SLIME_DT_FLOAT16;
    case at::kBFloat16: return SLIME_DT_BFLOAT16;
    case at::kFloat: return SLIME_DT_FLOAT32;
    case at::kDouble: return SLIME_DT_FLOAT64;
    case at::kBool: return SLIME_DT_BOOL;
    default:
      TORCH_CHECK(false, "dlslime: ", op, " does not support dtype ",
                  tensor.scalar_type(),
                  " (reductions take float16, bfloat16, float32, float64, "
                  "int8, uint8, int16, int32, int64 and bool)");
  }
}

slime_redop_t reduction_op(const c10d::ReduceOp& reduce_op, const char* op) {
  switch (reduce_op.op_) {
    case c10d::ReduceOp::SUM: return SLIME_RED_SUM;
    case c10d::ReduceOp::AVG: return SLIME_RED_AVG;
    case c10d::ReduceOp::PRODUCT: return SLIME_RED_PROD;
    case c10d::ReduceOp::MIN: return SLIME_RED_MIN;
    case c10d::ReduceOp::MAX: return SLIME_RED_MAX;
    case c10d::ReduceOp::BAND: return SLIME_RED_BAND;
    case c10d::ReduceOp::BOR: return SLIME_RED_BOR;
    case c10d::ReduceOp::BXOR: return SLIME_RED_BXOR;
    default:
      TORCH_CHECK(false, "dlslime: ", op, " does not support ReduceOp.",
                  reduce_op_name(reduce_op.op_));
  }
}

Reduction checked_reduction(const at::Tensor& tensor,
                            const c10d::ReduceOp& reduce_op, const char* op) {
  Reduction r{reduction_dtype(tensor, op), reduction_op(reduce_op, op)};
  if (slime_redop_check(r.op, r.dtype) != SLIME_OK) {
    std::string detail = slime_last_error();
    TORCH_CHECK(false, "dlslime: ", op, " does not support ReduceOp.",
                reduce_op_name(reduce_op.op_), " on ", tensor.scalar_type(),
                detail.empty() ? "" : ": ", detail);
  }
  return r;
}

} // namespace dlslime_shim
