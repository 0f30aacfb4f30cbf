// staging.h - contiguous buffers for the C library.
//
// libdlslime takes (pointer, bytes).  A contiguous tensor is used as is;
// any other is copied into a contiguous buffer first (inputs) and/or
// copied back once the operation succeeded (outputs).  Lists of tensors
// go to the C library block by block (the *_ptrs collectives), except
// the coalesced collectives', which one staging buffer (blocks()) moves or
// reduces in one go.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace dlslime_shim {

class Staging {
 public:
  // A contiguous tensor with t's content; t itself when contiguous.
  at::Tensor input(const at::Tensor& t);
  // A contiguous tensor the op writes, copied into t afterwards when it
  // is not t itself.  copy_in: the op also reads it (in-place ops).
  at::Tensor output(const at::Tensor& t, bool copy_in);
  // A private contiguous copy of t, for an op that may overwrite its
  // buffer (reduce on a non-root rank) while t must stay as it was.
  at::Tensor scratch(const at::Tensor& t);
  // input(t), or scratch(t) when t shares memory with any of outputs
  // without being `own` (this rank's block, in place): the op writes the
  // outputs while it may still read t.
  at::Tensor input_apart(const at::Tensor& t,
                         const std::vector<at::Tensor>& outputs,
                         const void* own);
  // A byte buffer of `parts` equal blocks: block r holds the r-th of
  // `parts` equal chunks (by bytes, in row-major order) of each tensor,
  // one tensor after another.  parts 1: the tensors' bytes one after
  // another (a flat buffer); parts = group size: the layout in which
  // every rank's share of several tensors is one block, as all_gather and
  // reduce_scatter want it.  Filled when copy_in; each chunk is copied
  // back to its tensor after success when copy_out.  Every tensor's
  // bytes must divide by parts.
  at::Tensor blocks(const std::vector<at::Tensor>& tensors, int64_t parts,
                    bool copy_in, bool copy_out);

  // Every tensor the C library may touch, to keep alive until it is
  // done: moved out, so the last use of keep_alive.
  std::vector<at::Tensor> take_keep_alive();
  // The copies back into the caller's tensors, to run after success.
  std::function<void()> copy_back() const;

 private:
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> back_;
};

// Data pointer the C library may be given for t (never NULL, even for
// an empty tensor).
void* data_of(const at::Tensor& t);

// Whether the storages of a and b (CPU tensors) share any address: a
// cheap, conservative test for an input that an output could clobber.
bool overlaps(const at::Tensor& a, const at::Tensor& b);

} // namespace dlslime_shim
