// work.cpp - see work.h.
#include "work.h"

#include <algorithm>
#include <memory>

#include <c10/util/Exception.h>

#include "errors.h"

namespace dlslime_shim {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a wait gives the progress thread to run a completion callback
// after the request itself was seen complete, or a cancel to land.
constexpr milliseconds kCallbackGrace{10000};

int64_t ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? left.count() : 0;
}

} // namespace

WorkDlslime::WorkDlslime(int rank, WorkSpec spec)
    : c10d::Work(rank, spec.type, spec.profiling_title),
      spec_(std::move(spec)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

WorkDlslime::~WorkDlslime() {
  // Runs after the completion callback (which held a reference), or for
  // a Work whose request was never posted.
  if (req_)
    slime_req_free(req_);
}

void WorkDlslime::arm(const c10::intrusive_ptr<WorkDlslime>& work,
                      slime_req_t* req) {
  work->req_ = req;
  auto* holder = new c10::intrusive_ptr<WorkDlslime>(work);
  slime_status_t st = slime_req_on_complete(req, &WorkDlslime::on_complete,
                                            holder);
  if (st != SLIME_OK) {
    // Not armed: nothing will call back, so fail the Work here.
    std::string detail = slime_last_error();
    delete holder;
    std::exception_ptr err = status_exception(work->spec_.what, st, detail);
    work->finish(err);
    work->future_->setError(err);
  }
}

void WorkDlslime::on_complete(slime_req_t* req, void* arg) {
  std::unique_ptr<c10::intrusive_ptr<WorkDlslime>> holder(
      static_cast<c10::intrusive_ptr<WorkDlslime>*>(arg));
  (*holder)->complete(slime_req_test(req));
  // Dropping the holder may free the Work and with it the request: the
  // core allows that from inside the request's own callback.
}

void WorkDlslime::complete(slime_status_t status) noexcept {
  std::exception_ptr err;
  try {
    if (status == SLIME_OK) {
      if (spec_.on_success)
        spec_.on_success(req_);
    } else if (status == SLIME_ERR_CANCELED && timed_out_ms_.load() > 0) {
      err = backend_error("dlslime: " + spec_.what + " timed out after " +
                          std::to_string(timed_out_ms_.load()) +
                          " ms and was canceled");
    } else {
      err = status_exception(spec_.what, status, slime_req_error(req_));
    }
  } catch (...) {
    err = std::current_exception();
  }
  try {
    // The C library is done with them; only the outputs stay.
    spec_.keep_alive.clear();
    spec_.on_success = nullptr;
    finish(err);
    if (err)
      future_->setError(err);
    else
      future_->markCompleted(c10::IValue(spec_.outputs));
  } catch (...) {
    // A Future callback threw; it must not unwind into the C library.
  }
}

bool WorkDlslime::completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool WorkDlslime::isCompleted() {
  if (!completed())
    slime_req_test(req_); // drives progress once
  return completed();
}

bool WorkDlslime::wait(milliseconds timeout) {
  milliseconds limit = timeout == kNoTimeout ? spec_.timeout : timeout;
  Clock::time_point deadline = Clock::now() + limit;
  // Waiting in the C library drives progress from this thread, so short
  // operations finish without a thread hand-off.
  while (!completed()) {
    int64_t left = ms_left(deadline);
    if (left == 0)
      break;
    slime_req_wait(req_, left);
    if (slime_req_test(req_) != SLIME_INPROGRESS) {
      // Done in the core; its callback runs in the progress thread.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, kCallbackGrace, [this] { return completed_; });
      break;
    }
  }
  if (!completed() && spec_.cancel_on_timeout) {
    timed_out_ms_.store(std::max<int64_t>(limit.count(), 1));
    if (slime_req_cancel(req_) == SLIME_OK) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, kCallbackGrace, [this] { return completed_; });
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!completed_)
    std::rethrow_exception(backend_error(
        "dlslime: " + spec_.what + " did not complete within " +
        std::to_string(limit.count()) + " ms"));
  if (exception_)
    std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDlslime::getFuture() {
  return future_;
}

std::vector<at::Tensor> WorkDlslime::result() {
  return spec_.outputs;
}

int WorkDlslime::sourceRank() const {
  TORCH_CHECK(spec_.source_of, "dlslime: sourceRank() is only defined for a "
              "recv from any source, not for ", spec_.what);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(completed_ && !exception_, "dlslime: sourceRank() of ",
                spec_.what, " before it completed successfully");
  }
  return spec_.source_of(req_);
}

} // namespace dlslime_shim
