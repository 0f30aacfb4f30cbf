// work.cpp - see work.h.
#include "work.h"

#include <algorithm>
#include <memory>

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "completions.h"
#include "errors.h"

namespace dlslime_shim {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a wait gives the completion thread to finish a Work it took
// on (its copy-outs), or a cancel to land.
constexpr milliseconds kCallbackGrace{10000};

int64_t ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? left.count() : 0;
}

} // namespace

std::string OpName::text() const {
  std::string s = op;
  if (!toward)
    return s;
  if (peer == kAnySource)
    s += std::string(" ") + toward + " any source";
  else
    s += std::string(" ") + toward + " rank " + std::to_string(peer);
  return s + " (tag " + std::to_string(tag) + ")";
}

// c10d::Work makes a RecordFunction for a titled op, an allocation per
// op, and keeps it only when a profiler listens: the title (and the
// tensors, whose shapes the profiler records) go only to one that does.
WorkDlslime::WorkDlslime(int rank, WorkSpec spec)
    : WorkDlslime(rank, std::move(spec), at::hasCallbacks()) {}

WorkDlslime::WorkDlslime(int rank, WorkSpec spec, bool profiled)
    : c10d::Work(rank, spec.type, profiled ? spec.profiling_title : nullptr,
                 profiled ? std::make_optional(spec.outputs) : std::nullopt),
      spec_(std::move(spec)) {}

namespace {

// What a Work dropped before its request completed leaves behind: the
// request and the buffers the C library still uses.
struct Orphan {
  std::vector<at::Tensor> keep_alive;
};

void orphan_done(slime_req_t* req, void* arg) {
  std::unique_ptr<Orphan> orphan(static_cast<Orphan*>(arg));
  // The core allows freeing a request inside its own callback.
  slime_req_free(req);
}

} // namespace

WorkDlslime::~WorkDlslime() {
  // A Future callback, if one was armed, held a reference until it ran:
  // here the request is either complete or has no callback.
  if (!req_)
    return;
  if (claimed_.load() || slime_req_test(req_) != SLIME_INPROGRESS) {
    slime_req_free(req_);
    return;
  }
  auto* orphan = new Orphan{std::move(spec_.keep_alive)};
  if (slime_req_on_complete(req_, &orphan_done, orphan) != SLIME_OK) {
    // Cannot happen (no other callback is armed); if it did, freeing the
    // tensors could let the library write into freed memory: keep them.
    return;
  }
}

void WorkDlslime::arm(slime_req_t* req) {
  req_ = req;
}

void WorkDlslime::on_complete(slime_req_t* req, void* arg) {
  auto* holder = static_cast<c10::intrusive_ptr<WorkDlslime>*>(arg);
  // On the core's thread: finishing runs the Future's callbacks, which may
  // wait for the GIL; the completion thread does that (completions.h).
  auto finish = [req, holder]() noexcept {
    std::unique_ptr<c10::intrusive_ptr<WorkDlslime>> owned(holder);
    WorkDlslime& work = **owned;
    if (!work.claimed_.exchange(true))
      work.complete(slime_req_test(req));
    // Dropping the holder may free the Work and with it the request: the
    // core allows that while or after the request's callback runs.
  };
  try {
    post_completion(finish);
  } catch (...) {
    // No thread or no memory to queue with: finish here rather than never.
    finish();
  }
}

bool WorkDlslime::finish_if_done() {
  slime_status_t st = slime_req_test(req_);
  if (st == SLIME_INPROGRESS || claimed_.exchange(true))
    return false;
  complete(st);
  return true;
}

void WorkDlslime::complete(slime_status_t status) noexcept {
  if (spec_.timed)
    duration_us_.store(std::chrono::duration_cast<std::chrono::microseconds>(
                           Clock::now() - posted_)
                           .count());
  std::exception_ptr err;
  try {
    if (status == SLIME_OK) {
      size_t got = slime_req_bytes(req_);
      TORCH_CHECK(spec_.expect_bytes == kAnyBytes || got == spec_.expect_bytes,
                  "dlslime: ", spec_.what.text(), ": expected a message of ",
                  spec_.expect_bytes, " bytes, got ", got, " bytes");
      if (spec_.on_success)
        spec_.on_success(req_);
    } else if (status == SLIME_ERR_CANCELED && timed_out_ms_.load() > 0) {
      err = backend_error("dlslime: " + spec_.what.text() + ": Timed out after " +
                          std::to_string(timed_out_ms_.load()) +
                          " ms, and was canceled");
    } else {
      err = status_exception(spec_.what.text(), status, slime_req_error(req_));
    }
  } catch (...) {
    err = std::current_exception();
  }
  try {
    // The C library is done with them; only the outputs stay.
    spec_.keep_alive.clear();
    spec_.on_success = nullptr;
    finish(err);
    c10::intrusive_ptr<c10::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> lock(future_mu_);
      done_ = true;
      future = future_;
    }
    if (future) {
      if (err)
        future->setError(err);
      else
        future->markCompleted(c10::IValue(spec_.outputs));
    }
  } catch (...) {
    // A Future callback threw; it must not unwind into the core or end
    // the completion thread.
  }
}

bool WorkDlslime::completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool WorkDlslime::isCompleted() {
  if (!completed())
    finish_if_done(); // drives progress once
  return completed();
}

bool WorkDlslime::wait(milliseconds timeout) {
  milliseconds limit = timeout == kNoTimeout ? spec_.timeout : timeout;
  Clock::time_point deadline = Clock::now() + limit;
  // Waiting in the C library drives progress from this thread, and the
  // Work is finished here too: no thread hand-off on the way.
  while (!completed() && !finish_if_done()) {
    if (claimed_.load()) {
      // Another thread (a Future's callback) is finishing it.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, kCallbackGrace, [this] { return completed_; });
      break;
    }
    int64_t left = ms_left(deadline);
    if (left == 0)
      break;
    slime_req_wait(req_, left);
  }
  if (!completed() && spec_.cancel_on_timeout && !claimed_.load()) {
    timed_out_ms_.store(std::max<int64_t>(limit.count(), 1));
    slime_req_cancel(req_);
    if (!finish_if_done() && claimed_.load()) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, kCallbackGrace, [this] { return completed_; });
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!completed_)
    std::rethrow_exception(backend_error(
        "dlslime: " + spec_.what.text() + ": Timed out waiting " +
        std::to_string(limit.count()) + " ms for it to complete"));
  if (exception_)
    std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDlslime::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool arm_callback = false, mark_now = false;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      mark_now = done_;
      arm_callback = !done_ && !callback_armed_;
      callback_armed_ = callback_armed_ || arm_callback;
    }
    future = future_;
  }
  if (mark_now) {
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      err = exception_;
    }
    if (err)
      future->setError(err);
    else
      future->markCompleted(c10::IValue(spec_.outputs));
  } else if (arm_callback) {
    // Nobody may wait on the Work: it is finished when the request
    // completes, on the completion thread.  Outside future_mu_, which
    // finishing takes.
    auto* holder = new c10::intrusive_ptr<WorkDlslime>(
        c10::intrusive_ptr<WorkDlslime>::reclaim_copy(this));
    slime_status_t st =
        slime_req_on_complete(req_, &WorkDlslime::on_complete, holder);
    if (st != SLIME_OK) {
      std::string detail = slime_last_error();
      delete holder;
      TORCH_CHECK(false, "dlslime: ", spec_.what.text(), ": cannot arm the "
                  "Future's completion: ", detail);
    }
  }
  return future;
}

std::vector<at::Tensor> WorkDlslime::result() {
  return spec_.outputs;
}

int WorkDlslime::sourceRank() const {
  TORCH_CHECK(spec_.source_of, "dlslime: sourceRank() is only defined for a "
              "recv from any source, not for ", spec_.what.text());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(completed_ && !exception_, "dlslime: sourceRank() of ",
                spec_.what.text(), " before it completed successfully");
  }
  return spec_.source_of(req_);
}

float WorkDlslime::getDuration() const {
  TORCH_CHECK(spec_.timed, "dlslime: ", spec_.what.text(), " has no duration: "
              "enable collectives timing on the group before the op "
              "(ProcessGroup._enable_collectives_timing())");
  int64_t us = duration_us_.load();
  TORCH_CHECK(us >= 0, "dlslime: ", spec_.what.text(),
              " has no duration before it completed");
  return static_cast<float>(us) / 1000.0f;
}

} // namespace dlslime_shim
