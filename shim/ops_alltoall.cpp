// ops_alltoall.cpp - all_to_all_single (even or uneven splits) and
// all_to_all (lists), both on slime_alltoallv.
#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

namespace {

struct Layout {
  std::vector<size_t> bytes; // per peer
  std::vector<size_t> offs;  // per peer, from the buffer's start
};

Layout layout_of(std::vector<size_t> bytes) {
  Layout l;
  size_t off = 0;
  for (size_t b : bytes) {
    l.offs.push_back(off);
    off += b;
  }
  l.bytes = std::move(bytes);
  return l;
}

// Bytes of one dim-0 row of t.
size_t row_bytes(const at::Tensor& t) {
  size_t n = t.element_size();
  for (int64_t d = 1; d < t.dim(); d++)
    n *= static_cast<size_t>(t.size(d));
  return n;
}

// Per-peer byte counts of t split along dim 0 by splits (empty: evenly).
std::vector<size_t> split_bytes(const at::Tensor& t,
                                const std::vector<int64_t>& splits, int size,
                                const char* which) {
  const char* op = "all_to_all_single";
  TORCH_CHECK(t.dim() >= 1, "dlslime: ", op, ": the ", which,
              " must have at least one dimension");
  int64_t rows = t.size(0);
  std::vector<size_t> bytes;
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "dlslime: ", op, ": the ", which, "'s ",
                rows, " rows do not split evenly over ", size, " ranks");
    bytes.assign(size, static_cast<size_t>(rows / size) * row_bytes(t));
    return bytes;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "dlslime: ", op,
              ": ", which, " split sizes need one entry per rank (", size,
              "), got ", splits.size());
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "dlslime: ", op, ": negative ", which, " split size ",
                s);
    sum += s;
    bytes.push_back(static_cast<size_t>(s) * row_bytes(t));
  }
  TORCH_CHECK(sum == rows, "dlslime: ", op, ": ", which,
              " split sizes add up to ", sum, " but it has ", rows, " rows");
  return bytes;
}

} // namespace

c10::intrusive_ptr<c10d::Work> BackendDlslime::alltoall_base(
    at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  check_cpu(output, op);
  check_cpu(input, op);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "dlslime: ", op,
              ": dtype mismatch (", input.scalar_type(), " input, ",
              output.scalar_type(), " output)");
  Layout send = layout_of(split_bytes(input, input_split_sizes, size_,
                                      "input"));
  Layout recv = layout_of(split_bytes(output, output_split_sizes, size_,
                                      "output"));
  TORCH_CHECK(row_bytes(input) == row_bytes(output), "dlslime: ", op,
              ": input and output rows differ in shape");
  Staging staging;
  at::Tensor src = staging.input(input);
  at::Tensor dst = staging.output(output, false);
  return post_collective(
      collective_spec(c10d::OpType::ALLTOALL_BASE, "dlslime:all_to_all_single",
                      op, {output}, staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_alltoallv(comm, data_of(src), send.bytes.data(),
                               send.offs.data(), data_of(dst),
                               recv.bytes.data(), recv.offs.data(), out);
      });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "dlslime: ", op, ": expected ", size_,
              " input and output tensors (one per rank), got ", inputs.size(),
              " and ", outputs.size());
  // Each tensor is handed over where it is (a copy only for one that is
  // not contiguous): no flat buffer to fill and to copy out of.
  Staging staging;
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  for (int r = 0; r < size_; r++) {
    check_cpu(inputs[r], op);
    check_cpu(outputs[r], op);
  }
  for (int r = 0; r < size_; r++) {
    // An input that shares memory with an output could be overwritten
    // by a receive before it is sent: it goes from a private copy.
    bool shared = false;
    for (int q = 0; q < size_ && !shared; q++)
      shared = overlaps(inputs[r], outputs[q]);
    at::Tensor in = shared ? staging.scratch(inputs[r])
                           : staging.input(inputs[r]);
    at::Tensor out = staging.output(outputs[r], false);
    send_bytes.push_back(in.nbytes());
    recv_bytes.push_back(out.nbytes());
    srcs.push_back(data_of(in));
    dsts.push_back(data_of(out));
  }
  return post_collective(
      collective_spec(c10d::OpType::ALLTOALL, "dlslime:all_to_all", op,
                      outputs, staging, opts.asyncOp),
      opts.timeout, [&](slime_comm_t* comm, slime_req_t** out) {
        return slime_alltoallv_ptrs(comm, srcs.data(), send_bytes.data(),
                                    dsts.data(), recv_bytes.data(), out);
      });
}

} // namespace dlslime_shim
