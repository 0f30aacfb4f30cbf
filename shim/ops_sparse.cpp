// ops_sparse.cpp - all_reduce of a sparse COO tensor, as Gloo does it:
// every rank's indices and values (their counts differ from rank to rank)
// are gathered by every rank, which sums them and coalesces.  SUM only,
// as in Gloo.
//
// Two collectives: an all_gather of every rank's shape and count, waited
// for here (the second needs them), then one all_to_all_v that sends this
// rank's indices and values, packed in one buffer, to every rank; the
// Work's success action sums what came.  So the call returns once every
// rank has reached it, not at once as the dense ops do.
#include <c10/util/Exception.h>

#include "backend.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

namespace {

// What each rank tells the others first: nnz, sparse_dim, dense_dim,
// ndim, then the sizes (padded), so that every rank's record has one
// length whatever the tensor.
constexpr int kHead = 4;
constexpr int kMaxDims = 64;
constexpr int kMeta = kHead + kMaxDims;

std::vector<int64_t> meta_of(const at::Tensor& t) {
  std::vector<int64_t> m(kMeta, 0);
  m[0] = t._nnz();
  m[1] = t.sparse_dim();
  m[2] = t.dense_dim();
  m[3] = t.dim();
  for (int64_t d = 0; d < t.dim(); d++)
    m[kHead + d] = t.size(d);
  return m;
}

// Bytes of one nonzero: its indices (int64) and its values.
size_t entry_bytes(const at::Tensor& t) {
  size_t n = static_cast<size_t>(t.sparse_dim()) * sizeof(int64_t);
  size_t row = t.element_size();
  for (int64_t d = t.sparse_dim(); d < t.dim(); d++)
    row *= static_cast<size_t>(t.size(d));
  return n + row;
}

// This rank's indices then values, as bytes.
at::Tensor pack(const at::Tensor& t) {
  at::Tensor idx = t._indices().contiguous().reshape({-1}).view(at::kByte);
  at::Tensor val = t._values().contiguous().reshape({-1}).view(at::kByte);
  return at::cat({idx, val});
}

// The sparse tensor of one rank's block of bytes (copied: a block may
// start at an offset its values' dtype cannot view).
at::Tensor unpack(const at::Tensor& block, int64_t nnz, const at::Tensor& like) {
  int64_t idx_bytes = like.sparse_dim() * nnz * static_cast<int64_t>(sizeof(int64_t));
  at::Tensor idx = block.narrow(0, 0, idx_bytes).clone().view(at::kLong)
                       .view({like.sparse_dim(), nnz});
  std::vector<int64_t> vshape{nnz};
  for (int64_t d = like.sparse_dim(); d < like.dim(); d++)
    vshape.push_back(like.size(d));
  at::Tensor val = block.narrow(0, idx_bytes, block.numel() - idx_bytes)
                       .clone().view(like.scalar_type()).view(vshape);
  return at::_sparse_coo_tensor_unsafe(idx, val, like.sizes(), like.options());
}

void check_same_shape(const at::Tensor& metas, int size, const char* op) {
  auto m = metas.view({size, kMeta});
  for (int r = 1; r < size; r++)
    TORCH_CHECK(at::equal(m[r].narrow(0, 1, kMeta - 1),
                          m[0].narrow(0, 1, kMeta - 1)),
                "dlslime: ", op, ": ranks 0 and ", r, " hold sparse tensors "
                "of different shapes or sparse/dense dimensions");
}

} // namespace

at::Tensor BackendDlslime::gather_sparse_meta(const at::Tensor& mine,
                                              std::chrono::milliseconds timeout,
                                              const char* op) {
  Staging staging;
  at::Tensor meta = staging.input(at::tensor(meta_of(mine), at::kLong));
  at::Tensor metas = staging.input(at::empty({size_ * kMeta}, at::kLong));
  post_collective(collective_spec(c10d::OpType::_ALLREDUCE_SPARSE,
                                  "dlslime:all_reduce_sparse", op, {}, staging),
                  timeout, [&](slime_comm_t* comm, slime_req_t** out) {
                    return slime_allgather(comm, data_of(meta), meta.nbytes(),
                                           data_of(metas), out);
                  })->wait();
  return metas;
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce (sparse)";
  TORCH_CHECK(tensors.size() == 1, "dlslime: ", op,
              " takes exactly one tensor per call, got ", tensors.size());
  at::Tensor& t = tensors[0];
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.layout() == at::kSparse,
              "dlslime: ", op, " takes a sparse COO CPU tensor");
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "dlslime: ", op,
              ": unsupported reduction operation (allreduce of sparse "
              "tensors only works with ReduceOp.SUM)");
  TORCH_CHECK(t.dim() <= kMaxDims, "dlslime: ", op, ": more than ", kMaxDims,
              " dimensions");
  at::Tensor mine = t.coalesce();
  at::Tensor metas = gather_sparse_meta(mine, opts.timeout, op);
  check_same_shape(metas, size_, op);

  Staging staging;
  at::Tensor src = staging.input(pack(mine));
  std::vector<size_t> send_bytes(size_, src.nbytes()), send_offs(size_, 0);
  std::vector<size_t> recv_bytes, recv_offs;
  std::vector<int64_t> nnz;
  size_t total = 0;
  for (int r = 0; r < size_; r++) {
    nnz.push_back(metas[r * kMeta].item<int64_t>());
    recv_offs.push_back(total);
    recv_bytes.push_back(static_cast<size_t>(nnz.back()) * entry_bytes(mine));
    total += recv_bytes.back();
  }
  at::Tensor dst = staging.input(at::empty({static_cast<int64_t>(total)}, at::kByte));
  WorkSpec spec = collective_spec(c10d::OpType::_ALLREDUCE_SPARSE,
                                  "dlslime:all_reduce_sparse", op, tensors, staging);
  spec.on_success = [t, mine, dst, nnz, recv_offs, recv_bytes](slime_req_t*) {
    at::Tensor sum;
    for (size_t r = 0; r < nnz.size(); r++) {
      at::Tensor part = unpack(dst.narrow(0, recv_offs[r], recv_bytes[r]), nnz[r], mine);
      sum = r ? sum + part : part;
    }
    t.copy_(sum.coalesce());
  };
  return post_collective(std::move(spec), opts.timeout,
                         [&](slime_comm_t* comm, slime_req_t** out) {
    return slime_alltoallv(comm, data_of(src), send_bytes.data(),
                           send_offs.data(), data_of(dst), recv_bytes.data(),
                           recv_offs.data(), out);
  });
}

} // namespace dlslime_shim
