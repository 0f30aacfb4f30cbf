// checks.h - argument checks shared by the ops: each failure is a
// RuntimeError that names the op ("dlslime: all_gather: ...").
#pragma once

#include <vector>

#include <ATen/ATen.h>

namespace dlslime_shim {

// The one tensor of a single-tensor op; it must be a dense CPU tensor.
const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors,
                                const char* op);
// A dense CPU tensor.
void check_cpu(const at::Tensor& t, const char* op);
// t has ref's dtype and number of elements.
void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op);
// A list of exactly `size` tensors, each like ref.
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref,
                int size, const char* op);
// 0 <= rank < size.
void check_rank(int64_t rank, int size, const char* what, const char* op);

} // namespace dlslime_shim
