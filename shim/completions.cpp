// completions.cpp - see completions.h.
#include "completions.h"

#include <Python.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

namespace dlslime_shim {

namespace {

// Lets go of the GIL for a scope if this thread holds it: what a drain
// waits for may need it.
class WithoutGil {
 public:
  WithoutGil() {
    if (Py_IsInitialized() && PyGILState_Check())
      saved_ = PyEval_SaveThread();
  }
  ~WithoutGil() {
    if (saved_)
      PyEval_RestoreThread(saved_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

class CompletionThread {
 public:
  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      // Detached: the object outlives it (never destroyed), and at exit
      // nothing may wait for a thread that could be stuck on the GIL.
      std::thread worker([this] { run(); });
      id_ = worker.get_id();
      worker.detach();
      started_ = true;
    }
    queue_.push_back(std::move(fn));
    ++posted_;
    queued_cv_.notify_one();
  }

  bool drain(std::chrono::milliseconds timeout) {
    WithoutGil nogil;
    std::unique_lock<std::mutex> lock(mu_);
    if (!started_ || std::this_thread::get_id() == id_)
      return true;
    uint64_t target = posted_;
    return ran_cv_.wait_for(lock, timeout, [&] { return ran_ >= target; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      // Idle until there is work; nothing waits on this wait.
      queued_cv_.wait(lock, [this] { return !queue_.empty(); });
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr; // what it holds (a Work) goes before it counts as run
      lock.lock();
      ++ran_;
      ran_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable queued_cv_, ran_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t posted_ = 0, ran_ = 0;
  bool started_ = false;
  std::thread::id id_;
};

CompletionThread& completion_thread() {
  static auto* thread = new CompletionThread;
  return *thread;
}

} // namespace

void post_completion(std::function<void()> fn) {
  completion_thread().post(std::move(fn));
}

bool drain_completions(std::chrono::milliseconds timeout) {
  return completion_thread().drain(timeout);
}

} // namespace dlslime_shim
