// ops_p2p.cpp - send, recv and recv from any source: the communicator's
// point-to-point calls with the user's tag.
#include <string>

#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "staging.h"

namespace dlslime_shim {

namespace {

uint64_t user_tag(int tag, const char* op) {
  TORCH_CHECK(tag >= 0 && static_cast<uint64_t>(tag) < kOwnTagBase,
              "dlslime: ", op, ": tag ", tag, " must be non-negative");
  return static_cast<uint64_t>(tag);
}

std::string peer_text(const char* op, const char* dir, int peer, int tag) {
  return std::string(op) + " " + dir + " rank " + std::to_string(peer) +
      " (tag " + std::to_string(tag) + ")";
}

// After a receive: the message must fill the tensor exactly, as with
// Gloo; then the staging copy (if any) goes back to the caller's tensor.
std::function<void(slime_req_t*)> finish_recv(const Staging& staging,
                                              size_t expected,
                                              std::string what) {
  auto copy_back = staging.copy_back();
  return [copy_back, expected, what](slime_req_t* req) {
    size_t got = slime_req_bytes(req);
    TORCH_CHECK(got == expected, "dlslime: ", what, ": expected a message of ",
                expected, " bytes, got ", got, " bytes");
    if (copy_back)
      copy_back();
  };
}

} // namespace

c10::intrusive_ptr<c10d::Work> BackendDlslime::send(
    std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = single_tensor(tensors, "send");
  check_rank(dst, size_, "destination", "send");
  uint64_t wire_tag = user_tag(tag, "send");
  Staging staging;
  at::Tensor buf = staging.input(t);
  WorkSpec spec;
  spec.type = c10d::OpType::SEND;
  spec.profiling_title = "dlslime:send";
  spec.what = peer_text("send", "to", dst, tag);
  spec.outputs = tensors;
  spec.keep_alive = staging.keep_alive();
  spec.timeout = timeout_of(c10d::kUnsetTimeout);
  return post(std::move(spec), [&](slime_comm_t* comm, slime_req_t** out) {
    return slime_comm_send(comm, dst, data_of(buf), buf.nbytes(), wire_tag,
                           out);
  });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::recv(
    std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = single_tensor(tensors, "recv");
  check_rank(src, size_, "source", "recv");
  uint64_t wire_tag = user_tag(tag, "recv");
  Staging staging;
  at::Tensor buf = staging.output(t, false);
  WorkSpec spec;
  spec.type = c10d::OpType::RECV;
  spec.profiling_title = "dlslime:recv";
  spec.what = peer_text("recv", "from", src, tag);
  spec.outputs = tensors;
  spec.keep_alive = staging.keep_alive();
  spec.on_success = finish_recv(staging, buf.nbytes(), spec.what);
  spec.timeout = timeout_of(c10d::kUnsetTimeout);
  spec.cancel_on_timeout = true;
  return post(std::move(spec), [&](slime_comm_t* comm, slime_req_t** out) {
    return slime_comm_recv(comm, src, data_of(buf), buf.nbytes(), wire_tag,
                           out);
  });
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = single_tensor(tensors, "recv");
  uint64_t wire_tag = user_tag(tag, "recv");
  Staging staging;
  at::Tensor buf = staging.output(t, false);
  WorkSpec spec;
  spec.type = c10d::OpType::RECVANYSOURCE;
  spec.profiling_title = "dlslime:recvAnySource";
  spec.what = "recv from any source (tag " + std::to_string(tag) + ")";
  spec.outputs = tensors;
  spec.keep_alive = staging.keep_alive();
  spec.on_success = finish_recv(staging, buf.nbytes(), spec.what);
  // Weak: a Work kept by the user must not keep the group alive.
  c10::weak_intrusive_ptr<BackendDlslime> self(
      c10::intrusive_ptr<BackendDlslime>::reclaim_copy(this));
  spec.source_of = [self](slime_req_t* req) {
    auto backend = self.lock();
    TORCH_CHECK(backend, "dlslime: the source rank of a receive whose "
                "process group was destroyed");
    return backend->source_of(req);
  };
  spec.timeout = timeout_of(c10d::kUnsetTimeout);
  spec.cancel_on_timeout = true;
  return post(std::move(spec), [&](slime_comm_t* comm, slime_req_t** out) {
    return slime_comm_recv(comm, SLIME_ANY_SOURCE, data_of(buf), buf.nbytes(),
                           wire_tag, out);
  });
}

} // namespace dlslime_shim
