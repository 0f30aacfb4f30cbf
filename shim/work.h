// work.h - c10d::Work for one libdlslime request.
//
// The Work finishes (copy-outs, error, waking waiters, its Future) in
// whichever thread first sees the request complete: a thread in wait()
// or isCompleted() does it itself, so a short operation costs no thread
// hand-off.  Only a Work whose Future was asked for (DDP comm hooks chain
// on it) registers a completion callback with the core, which hands the
// Work to the completion thread (completions.h) to finish if nobody
// waits: the Future's callbacks never run on the core's threads.  Until
// it is finished that way, the callback holds a reference to the Work.  A Work dropped while its
// request is still pending hands the tensors the C library uses to a
// callback that releases them when the request completes.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <dlslime/dlslime.h>

namespace dlslime_shim {

// Names an operation in errors: "all_reduce", "recv from rank 1 (tag 0)".
// Spelled out only when a message needs it: building the string for
// every send and receive cost several allocations per call.
struct OpName {
  static constexpr int kAnySource = -1;
  const char* op = "operation";
  const char* toward = nullptr; // "to" or "from" for a point-to-point op
  int peer = kAnySource;
  int tag = 0;

  OpName() = default;
  OpName(const char* op_) : op(op_) {} // NOLINT: a collective's name
  OpName(const char* op_, const char* toward_, int peer_, int tag_)
      : op(op_), toward(toward_), peer(peer_), tag(tag_) {}
  std::string text() const;
};

// No expected size: any number of bytes is a success.
constexpr size_t kAnyBytes = static_cast<size_t>(-1);

struct WorkSpec {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  const char* profiling_title = nullptr;
  OpName what;
  // The Future's value and result().
  std::vector<at::Tensor> outputs;
  // Every buffer the C library uses (staging copies included); released
  // once the request has completed.
  std::vector<at::Tensor> keep_alive;
  // Runs once the request succeeded, in the thread that finishes the
  // Work: copies out of staging buffers, size checks.  May throw; the
  // Work then fails with that.
  std::function<void(slime_req_t*)> on_success;
  // A receive: the message must fill the buffer exactly; a shorter one
  // fails the receive rather than leave the tensor's tail as it was
  // (checked before on_success).
  size_t expect_bytes = kAnyBytes;
  // For recv from any source: the rank a completed request came from.
  std::function<int(slime_req_t*)> source_of;
  // What wait() with no timeout waits for.
  std::chrono::milliseconds timeout{0};
  // A receive: a wait that runs out cancels it, so it cannot match later.
  bool cancel_on_timeout = false;
  // A synchronous collective (opts.asyncOp false): torch waits on it at
  // once, so the core need not wake its worker for it (the wait runs it).
  bool poster_waits = false;
  // Collectives timing is on (ProcessGroup._enable_collectives_timing):
  // getDuration() says how long the op took from post to completion.
  bool timed = false;
};

class WorkDlslime : public c10d::Work {
 public:
  WorkDlslime(int rank, WorkSpec spec);
  ~WorkDlslime() override;

  // Takes ownership of req, which is posted: the Work finishes when it
  // completes.
  void arm(slime_req_t* req);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  int sourceRank() const override;
  // Milliseconds from post to completion; a timed op only, once done.
  float getDuration() const override;

 private:
  WorkDlslime(int rank, WorkSpec spec, bool profiled);
  static void on_complete(slime_req_t* req, void* arg);
  // Finishes the Work if the request has completed and nobody else is
  // finishing it; true if this call did.
  bool finish_if_done();
  void complete(slime_status_t status) noexcept;
  bool completed();

  WorkSpec spec_;
  slime_req_t* req_ = nullptr;
  // When a timed op was posted (a clock read only where it is used).
  const std::chrono::steady_clock::time_point posted_ =
      spec_.timed ? std::chrono::steady_clock::now()
                  : std::chrono::steady_clock::time_point{};
  // Set when a timed op completes (-1: not yet).
  std::atomic<int64_t> duration_us_{-1};
  // Set by the one thread that finishes the Work.
  std::atomic<bool> claimed_{false};
  // Set by a wait that ran out: the limit it waited, for the message
  // of the cancel it causes (0: none did).
  std::atomic<int64_t> timed_out_ms_{0};
  // Guards future_, done_ and callback_armed_.
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool done_ = false;             // finished: future_ gets marked at once
  bool callback_armed_ = false;
};

} // namespace dlslime_shim
