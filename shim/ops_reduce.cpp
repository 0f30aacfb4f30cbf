// ops_reduce.cpp - the reductions: all_reduce, reduce, reduce_scatter
// (list and tensor).  The coalesced ones are in ops_coalesced.cpp, the
// sparse all_reduce in ops_sparse.cpp.
#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "dtype.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

c10::intrusive_ptr<c10d::Work> BackendDlslime::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
    return allreduce_sparse(tensors, opts);
  const at::Tensor& t = single_tensor(tensors, "all_reduce");
  Reduction red = checked_reduction(t, opts.reduceOp, "all_reduce");
  Staging staging;
  at::Tensor buf = staging.output(t, true);
  return post_collective(
      collective_spec(c10d::OpType::ALLREDUCE, "dlslime:all_reduce",
                      "all_reduce", tensors, staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_allreduce(comm, data_of(buf), buf.numel(), red.dtype,
                               red.op, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single_tensor(tensors, "reduce");
  check_rank(opts.rootRank, size_, "root", "reduce");
  TORCH_CHECK(opts.rootTensor == 0, "dlslime: reduce: rootTensor must be 0");
  Reduction red = checked_reduction(t, opts.reduceOp, "reduce");
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  // The core may use a non-root rank's buffer as scratch; the caller's
  // tensor stays as it was there.
  at::Tensor buf = rank_ == root ? staging.output(t, true)
                                 : staging.scratch(t);
  return post_collective(
      collective_spec(c10d::OpType::REDUCE, "dlslime:reduce", "reduce", tensors,
                      staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_reduce(comm, data_of(buf), buf.numel(), red.dtype,
                            red.op, root, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  const at::Tensor& output = single_tensor(outputs, op);
  TORCH_CHECK(inputs.size() == 1, "dlslime: ", op,
              " takes one input list per call, got ", inputs.size());
  check_list(inputs[0], output, size_, op);
  Reduction red = checked_reduction(output, opts.reduceOp, op);
  // Each input is read where it is (through a copy only when it is not
  // contiguous): no flat buffer to fill.  The output holds partial sums
  // while the inputs are still read, so an input sharing its memory goes
  // from a private copy.
  Staging staging;
  std::vector<const void*> blocks;
  for (const auto& t : inputs[0]) {
    at::Tensor in = overlaps(t, output) ? staging.scratch(t) : staging.input(t);
    blocks.push_back(data_of(in));
  }
  at::Tensor dst = staging.output(output, false);
  return post_collective(
      collective_spec(c10d::OpType::REDUCE_SCATTER, "dlslime:reduce_scatter",
                      op, outputs, staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_reduce_scatter_ptrs(comm, blocks.data(), data_of(dst),
                                         dst.numel(), red.dtype, red.op, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  check_cpu(output, op);
  check_cpu(input, op);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "dlslime: ", op,
              ": dtype mismatch (", input.scalar_type(), " input, ",
              output.scalar_type(), " output)");
  TORCH_CHECK(input.numel() == output.numel() * size_, "dlslime: ", op,
              ": the input must hold group size (", size_, ") x ",
              output.numel(), " elements, got ", input.numel());
  Reduction red = checked_reduction(output, opts.reduceOp, op);
  Staging staging;
  at::Tensor src = staging.input(input);
  at::Tensor dst = staging.output(output, false);
  return post_collective(
      collective_spec(c10d::OpType::_REDUCE_SCATTER_BASE,
                      "dlslime:reduce_scatter_tensor", op, {output}, staging,
                      opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_reduce_scatter(comm, data_of(src), data_of(dst),
                                    dst.numel(), red.dtype, red.op, out);
      });
}

} // namespace dlslime_shim
