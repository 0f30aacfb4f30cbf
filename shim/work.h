// work.h - c10d::Work for one libdlslime request.
//
// The request's completion callback (slime_req_on_complete) finishes the
// Work: it runs the op's copy-outs, records the error if any, wakes
// waiters and completes the Future that getFuture() handed out (DDP comm
// hooks chain on it).  Until that callback has run, it holds a reference
// to the Work, so the tensors the C library reads or writes stay alive
// however early the caller drops the Work.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <dlslime/dlslime.h>

namespace dlslime_shim {

struct WorkSpec {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  const char* profiling_title = nullptr;
  // Names the operation in errors: "all_reduce", "recv from rank 1 (tag 0)".
  std::string what;
  // The Future's value and result().
  std::vector<at::Tensor> outputs;
  // Every buffer the C library uses (staging copies included); released
  // once the request has completed.
  std::vector<at::Tensor> keep_alive;
  // Runs once the request succeeded, in the thread that completes it
  // (usually the context's progress thread): copies out of staging
  // buffers, size checks.  May throw; the Work then fails with that.
  std::function<void(slime_req_t*)> on_success;
  // For recv from any source: the rank a completed request came from.
  std::function<int(slime_req_t*)> source_of;
  // What wait() with no timeout waits for.
  std::chrono::milliseconds timeout{0};
  // A receive: a wait that runs out cancels it, so it cannot match later.
  bool cancel_on_timeout = false;
};

class WorkDlslime : public c10d::Work {
 public:
  WorkDlslime(int rank, WorkSpec spec);
  ~WorkDlslime() override;

  // Takes ownership of req and finishes work when req completes.
  static void arm(const c10::intrusive_ptr<WorkDlslime>& work,
                  slime_req_t* req);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  int sourceRank() const override;

 private:
  static void on_complete(slime_req_t* req, void* arg);
  void complete(slime_status_t status) noexcept;
  bool completed();

  WorkSpec spec_;
  slime_req_t* req_ = nullptr;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // Set by a wait that ran out: the limit it waited, for the message
  // of the cancel it causes (0: none did).
  std::atomic<int64_t> timed_out_ms_{0};
};

} // namespace dlslime_shim
