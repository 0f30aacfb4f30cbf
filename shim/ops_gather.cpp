// ops_gather.cpp - data movement without arithmetic: broadcast,
// all_gather (list and tensor), gather, scatter, and barrier.
#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

c10::intrusive_ptr<c10d::Work> BackendDlslime::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single_tensor(tensors, "broadcast");
  check_rank(opts.rootRank, size_, "root", "broadcast");
  TORCH_CHECK(opts.rootTensor == 0,
              "dlslime: broadcast: rootTensor must be 0");
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  at::Tensor buf = rank_ == root ? staging.input(t) : staging.output(t, false);
  return post_collective(
      collective_spec(c10d::OpType::BROADCAST, "dlslime:broadcast", "broadcast",
                      tensors, staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_broadcast(comm, data_of(buf), buf.nbytes(), root, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  const at::Tensor& input = single_tensor(inputs, op);
  TORCH_CHECK(outputs.size() == 1, "dlslime: ", op,
              " takes one output list per call, got ", outputs.size());
  check_list(outputs[0], input, size_, op);
  // Each output is written where it is (through a copy only when it is
  // not contiguous): no flat buffer to fill and to copy out of.
  Staging staging;
  std::vector<void*> blocks;
  for (const auto& t : outputs[0])
    blocks.push_back(data_of(staging.output(t, false)));
  at::Tensor src = staging.input_apart(input, outputs[0], blocks[rank_]);
  return post_collective(
      collective_spec(c10d::OpType::ALLGATHER, "dlslime:all_gather", op,
                      outputs[0], staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_allgather_ptrs(comm, data_of(src), src.nbytes(),
                                    blocks.data(), out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::_allgather_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  check_cpu(output, op);
  check_cpu(input, op);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "dlslime: ", op,
              ": dtype mismatch (", input.scalar_type(), " input, ",
              output.scalar_type(), " output)");
  TORCH_CHECK(output.numel() == input.numel() * size_, "dlslime: ", op,
              ": the output must hold group size (", size_, ") x ",
              input.numel(), " elements, got ", output.numel());
  Staging staging;
  at::Tensor src = staging.input(input);
  at::Tensor dst = staging.output(output, false);
  return post_collective(
      collective_spec(c10d::OpType::_ALLGATHER_BASE,
                      "dlslime:all_gather_into_tensor", op, {output}, staging,
                      opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_allgather(comm, data_of(src), src.nbytes(), data_of(dst),
                               out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op = "gather";
  const at::Tensor& input = single_tensor(inputs, op);
  check_rank(opts.rootRank, size_, "root", op);
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  at::Tensor src;
  std::vector<void*> blocks;
  std::vector<at::Tensor> results;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1, "dlslime: ", op,
                ": the root takes one output list, got ", outputs.size());
    check_list(outputs[0], input, size_, op);
    // each output is written where it is, as in all_gather
    for (const auto& t : outputs[0])
      blocks.push_back(data_of(staging.output(t, false)));
    src = staging.input_apart(input, outputs[0], blocks[rank_]);
    results = outputs[0];
  } else {
    src = staging.input(input);
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "dlslime: ", op, ": only the root (rank ", root,
                ") takes an output list");
  }
  return post_collective(
      collective_spec(c10d::OpType::GATHER, "dlslime:gather", op, results,
                      staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_gather_ptrs(comm, data_of(src), src.nbytes(),
                                 blocks.empty() ? nullptr : blocks.data(),
                                 root, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  const at::Tensor& output = single_tensor(outputs, op);
  check_rank(opts.rootRank, size_, "root", op);
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  at::Tensor dst = staging.output(output, false);
  std::vector<const void*> blocks;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1, "dlslime: ", op,
                ": the root takes one input list, got ", inputs.size());
    check_list(inputs[0], output, size_, op);
    // Each input is sent from where it is, except one sharing memory
    // with the output (other than being it, in place): the root writes
    // its own block while the others are still being sent.
    for (const auto& t : inputs[0])
      blocks.push_back(data_of(staging.input_apart(t, {output}, data_of(dst))));
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "dlslime: ", op, ": only the root (rank ", root,
                ") takes an input list");
  }
  return post_collective(
      collective_spec(c10d::OpType::SCATTER, "dlslime:scatter", op, outputs,
                      staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_scatter_ptrs(comm,
                                  blocks.empty() ? nullptr : blocks.data(),
                                  dst.nbytes(), data_of(dst), root, out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::barrier(
    const c10d::BarrierOptions& opts) {
  Staging none;
  return post_collective(
      collective_spec(c10d::OpType::BARRIER, "dlslime:barrier", "barrier", {},
                      none, opts.asyncOp),
      opts.timeout, [](slime_comm_t* comm, slime_req_t** out) {
        return slime_barrier(comm, out);
      });
}

} // namespace dlslime_shim
