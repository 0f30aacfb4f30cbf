// checks.cpp - see checks.h.
#include "checks.h"

#include <c10/util/Exception.h>

namespace dlslime_shim {

void check_cpu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "dlslime: ", op, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "dlslime: ", op,
              " supports CPU tensors only, got a tensor on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "dlslime: ", op,
              " supports dense (strided) tensors only, got layout ",
              t.layout());
}

const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors,
                                const char* op) {
  TORCH_CHECK(tensors.size() == 1, "dlslime: ", op,
              " takes exactly one tensor per call, got ", tensors.size());
  check_cpu(tensors[0], op);
  return tensors[0];
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op) {
  check_cpu(t, op);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "dlslime: ", op,
              ": dtype mismatch (", t.scalar_type(), " vs ",
              ref.scalar_type(), ")");
  TORCH_CHECK(t.numel() == ref.numel(), "dlslime: ", op,
              ": size mismatch (", t.numel(), " vs ", ref.numel(),
              " elements)");
}

void check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref,
                int size, const char* op) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "dlslime: ", op,
              ": expected a list of ", size, " tensors (one per rank), got ",
              list.size());
  for (const auto& t : list)
    check_like(t, ref, op);
}

void check_rank(int64_t rank, int size, const char* what, const char* op) {
  TORCH_CHECK(rank >= 0 && rank < size, "dlslime: ", op, ": ", what, " ",
              rank, " is not a rank of this group (size ", size, ")");
}

} // namespace dlslime_shim
