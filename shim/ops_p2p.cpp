// ops_p2p.cpp - send, recv and recv from any source: the communicator's
// point-to-point calls with the user's tag.
#include <c10/util/Exception.h>

#include "backend.h"
#include "checks.h"
#include "op_spec.h"
#include "staging.h"

namespace dlslime_shim {

namespace {

uint64_t user_tag(int tag, const char* op) {
  TORCH_CHECK(tag >= 0 && static_cast<uint64_t>(tag) < kOwnTagBase,
              "dlslime: ", op, ": tag ", tag, " must be non-negative");
  return static_cast<uint64_t>(tag);
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
  spec.what = OpName("send", "to", dst, tag);
  spec.outputs = tensors;
  spec.keep_alive = staging.take_keep_alive();
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
  spec.what = OpName("recv", "from", src, tag);
  spec.outputs = tensors;
  spec.expect_bytes = buf.nbytes();
  spec.on_success = copy_back_of(staging);
  spec.keep_alive = staging.take_keep_alive();
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
  spec.what = OpName("recv", "from", OpName::kAnySource, tag);
  spec.outputs = tensors;
  spec.expect_bytes = buf.nbytes();
  spec.on_success = copy_back_of(staging);
  spec.keep_alive = staging.take_keep_alive();
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
