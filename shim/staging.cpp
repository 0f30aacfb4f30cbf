// staging.cpp - see staging.h.
#include "staging.h"

#include <c10/util/Exception.h>

namespace dlslime_shim {

namespace {

// Views a contiguous tensor's storage as bytes.
at::Tensor as_bytes(const at::Tensor& t) {
  return t.reshape({-1}).view(at::kByte);
}

// Copies bytes (a byte tensor of t's size, of any shape) into t, whatever
// t's layout: a byte slice may sit at an offset t's dtype cannot view.
void copy_bytes_into(const at::Tensor& t, const at::Tensor& bytes) {
  at::Tensor dst = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  as_bytes(dst).view(bytes.sizes()).copy_(bytes);
  if (!dst.is_same(t))
    t.copy_(dst);
}

} // namespace

void* data_of(const at::Tensor& t) {
  // An empty tensor may have no storage; the C library still wants a
  // valid address for a zero-length buffer.
  static char empty;
  void* p = t.numel() ? t.data_ptr() : nullptr;
  return p ? p : &empty;
}

at::Tensor Staging::input(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  keep_.push_back(t);
  if (!c.is_same(t))
    keep_.push_back(c);
  return c;
}

at::Tensor Staging::output(const at::Tensor& t, bool copy_in) {
  keep_.push_back(t);
  if (t.is_contiguous())
    return t;
  at::Tensor c = copy_in ? t.contiguous()
                         : at::empty(t.sizes(), t.options());
  keep_.push_back(c);
  back_.push_back([c, t]() { t.copy_(c); });
  return c;
}

at::Tensor Staging::scratch(const at::Tensor& t) {
  at::Tensor c = t.clone(at::MemoryFormat::Contiguous);
  keep_.push_back(c);
  return c;
}

at::Tensor Staging::input_apart(const at::Tensor& t,
                               const std::vector<at::Tensor>& outputs,
                               const void* own) {
  at::Tensor in = input(t);
  if (data_of(in) == own) return in;
  for (const auto& o : outputs)
    if (overlaps(t, o)) return scratch(t);
  return in;
}

at::Tensor Staging::blocks(const std::vector<at::Tensor>& tensors,
                           int64_t parts, bool copy_in, bool copy_out) {
  int64_t row = 0; // bytes of one block
  for (const auto& t : tensors) {
    TORCH_CHECK(static_cast<int64_t>(t.nbytes()) % parts == 0, "dlslime: ",
                t.nbytes(), " bytes do not split into ", parts, " blocks");
    row += static_cast<int64_t>(t.nbytes()) / parts;
  }
  at::Tensor buf = at::empty({parts * row},
                             at::TensorOptions().dtype(at::kByte));
  keep_.push_back(buf);
  at::Tensor grid = buf.view({parts, row});
  int64_t col = 0;
  for (const auto& t : tensors) {
    int64_t n = static_cast<int64_t>(t.nbytes()) / parts;
    at::Tensor chunks = grid.narrow(1, col, n);
    col += n;
    keep_.push_back(t);
    if (copy_in && n)
      chunks.copy_(as_bytes(t.contiguous()).view({parts, n}));
    if (copy_out && n)
      back_.push_back([chunks, t]() { copy_bytes_into(t, chunks); });
  }
  return buf;
}

std::vector<at::Tensor> Staging::take_keep_alive() {
  return std::move(keep_);
}

std::function<void()> Staging::copy_back() const {
  if (back_.empty())
    return nullptr;
  auto copies = back_;
  return [copies] {
    for (const auto& copy : copies)
      copy();
  };
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (!a.numel() || !b.numel() || !a.has_storage() || !b.has_storage())
    return false;
  const auto* a0 = static_cast<const char*>(a.storage().data());
  const auto* b0 = static_cast<const char*>(b.storage().data());
  return a0 < b0 + b.storage().nbytes() && b0 < a0 + a.storage().nbytes();
}

} // namespace dlslime_shim
