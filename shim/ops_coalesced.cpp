// ops_coalesced.cpp - several tensors in one collective: all_gather_coalesced,
// all_gather_into_tensor_coalesced (FSDP2's all-gather),
// reduce_scatter_tensor_coalesced and all_reduce_coalesced.
//
// The tensors go through one staging buffer (Staging::blocks) laid out
// as the core's collective wants it: every rank's share of all the tensors
// is one block.  Data movement is by bytes, so any mix of dtypes is one
// collective.  A reduction is typed and the core reduces one dtype per
// collective: tensors of several dtypes take one collective per dtype,
// posted back to back (post_collectives).  One tensor (FSDP2's flat
// buffer, every functional collective of DTensor) is the plain op, which
// moves it where it is instead of through a staging copy.
#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "dtype.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

namespace {

// The indices of tensors grouped by dtype, groups in order of first
// appearance (the same on every rank, whose lists match).
std::vector<std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& ts) {
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < ts.size(); i++) {
    size_t g = 0;
    while (g < groups.size() &&
           ts[groups[g][0]].scalar_type() != ts[i].scalar_type())
      g++;
    if (g == groups.size())
      groups.emplace_back();
    groups[g].push_back(i);
  }
  return groups;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts,
                             const std::vector<size_t>& idx) {
  std::vector<at::Tensor> out;
  for (size_t i : idx)
    out.push_back(ts[i]);
  return out;
}

// bigs[i] (all_gather's outputs, reduce_scatter's inputs) holds group
// size x smalls[i]'s elements, of its dtype; all on the CPU.
void check_pairs(const std::vector<at::Tensor>& bigs, const char* big,
                 const std::vector<at::Tensor>& smalls, const char* small,
                 int size, const char* op) {
  TORCH_CHECK(!smalls.empty(), "dlslime: ", op, " got no tensors");
  TORCH_CHECK(bigs.size() == smalls.size(), "dlslime: ", op, ": ",
              bigs.size(), " ", big, "s for ", smalls.size(), " ", small, "s");
  for (size_t i = 0; i < bigs.size(); i++) {
    check_cpu(bigs[i], op);
    check_cpu(smalls[i], op);
    TORCH_CHECK(bigs[i].scalar_type() == smalls[i].scalar_type(), "dlslime: ",
                op, ": tensor ", i, ": dtype mismatch (", bigs[i].scalar_type(),
                " ", big, ", ", smalls[i].scalar_type(), " ", small, ")");
    TORCH_CHECK(bigs[i].numel() == smalls[i].numel() * size, "dlslime: ", op,
                ": tensor ", i, ": the ", big, " must hold group size (", size,
                ") x the ", small, "'s ", smalls[i].numel(), " elements, got ",
                bigs[i].numel());
  }
}

} // namespace

c10::intrusive_ptr<c10d::Work> BackendDlslime::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  TORCH_CHECK(!inputs.empty(), "dlslime: ", op, " got no tensors");
  for (const auto& t : inputs)
    check_cpu(t, op);
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size_, "dlslime: ",
              op, ": expected one output list per rank (", size_, "), got ",
              output_lists.size());
  // output_lists[r][i] receives rank r's inputs[i].
  std::vector<at::Tensor> outputs;
  for (const auto& list : output_lists) {
    TORCH_CHECK(list.size() == inputs.size(), "dlslime: ", op, ": an output "
                "list holds ", list.size(), " tensors for ", inputs.size(),
                " inputs");
    for (size_t i = 0; i < inputs.size(); i++)
      check_like(list[i], inputs[i], op);
    outputs.insert(outputs.end(), list.begin(), list.end());
  }
  // Block r of the gathered bytes is rank r's inputs one after another,
  // that is output_lists[r].
  Staging staging;
  at::Tensor src = staging.blocks(inputs, 1, true, false);
  at::Tensor dst = staging.blocks(outputs, 1, false, true);
  return post_collective(
      collective_spec(c10d::OpType::ALLGATHER_COALESCED,
                      "dlslime:all_gather_coalesced", op, outputs, staging,
                      opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_allgather(comm, data_of(src), src.nbytes(), data_of(dst),
                               out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  check_pairs(outputs, "output", inputs, "input", size_, op);
  if (inputs.size() == 1)
    return _allgather_base(outputs[0], inputs[0], opts);
  Staging staging;
  at::Tensor src = staging.blocks(inputs, 1, true, false);
  at::Tensor dst = staging.blocks(outputs, size_, false, true);
  return post_collective(
      collective_spec(c10d::OpType::COALESCED,
                      "dlslime:all_gather_into_tensor_coalesced", op, outputs,
                      staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_allgather(comm, data_of(src), src.nbytes(), data_of(dst),
                               out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  check_pairs(inputs, "input", outputs, "output", size_, op);
  if (inputs.size() == 1)
    return _reduce_scatter_base(outputs[0], inputs[0], opts);
  Staging staging;
  std::vector<KeptIssue> issues;
  for (const auto& group : by_dtype(inputs)) {
    std::vector<at::Tensor> ins = pick(inputs, group);
    Reduction red = checked_reduction(ins[0], opts.reduceOp, op);
    // Block r of src: every input's r-th chunk, reduced into rank r's
    // block of dst, which is its outputs one after another.
    at::Tensor src = staging.blocks(ins, size_, true, false);
    at::Tensor dst = staging.blocks(pick(outputs, group), 1, false, true);
    size_t count = dst.numel() / ins[0].element_size();
    issues.push_back([src, dst, count, red](slime_comm_t* comm,
                                            slime_req_t** out) {
      return slime_reduce_scatter(comm, data_of(src), data_of(dst), count,
                                  red.dtype, red.op, out);
    });
  }
  return post_collectives(
      collective_spec(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                      "dlslime:reduce_scatter_tensor_coalesced", op, outputs,
                      staging, opts.asyncOp),
      opts.timeout, issues);
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "dlslime: ", op, " got no tensors");
  for (const auto& t : tensors)
    check_cpu(t, op);
  if (tensors.size() == 1)
    return allreduce(tensors, opts);
  Staging staging;
  std::vector<KeptIssue> issues;
  for (const auto& group : by_dtype(tensors)) {
    std::vector<at::Tensor> ts = pick(tensors, group);
    Reduction red = checked_reduction(ts[0], opts.reduceOp, op);
    at::Tensor buf = staging.blocks(ts, 1, true, true);
    size_t count = buf.numel() / ts[0].element_size();
    issues.push_back([buf, count, red](slime_comm_t* comm, slime_req_t** out) {
      return slime_allreduce(comm, data_of(buf), count, red.dtype, red.op,
                             out);
    });
  }
  return post_collectives(
      collective_spec(c10d::OpType::ALLREDUCE_COALESCED,
                      "dlslime:all_reduce_coalesced", op, tensors, staging,
                      opts.asyncOp),
      opts.timeout, issues);
}

} // namespace dlslime_shim
