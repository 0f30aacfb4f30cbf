// monitored_barrier.cpp - a barrier that names the ranks that did not
// arrive, as Gloo's does: every rank reports to rank 0, which waits for
// them up to the timeout and then releases them all.  Runs on the
// communicator's point-to-point calls in tags above the users' range, one
// pair of tags per call so a late report never counts for the next one.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "backend.h"
#include "errors.h"

namespace dlslime_shim {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMonitorTagBase = kOwnTagBase;
// The cancel of a report that never came, or a send still in flight.
constexpr int64_t kDropWaitMs = 1000;

int64_t ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return left.count() > 0 ? left.count() : 0;
}

// The requests of one call and the bytes they use.  The bytes are freed
// only if every request is done: a request the core could not cancel
// keeps its (one-byte) buffer, leaked, rather than written after free.
class Requests {
 public:
  explicit Requests(int n) : reqs_(n, nullptr), bytes_(new uint8_t[n]()) {}
  ~Requests() {
    bool all_done = true;
    for (slime_req_t* req : reqs_) {
      if (!req)
        continue;
      if (slime_req_test(req) == SLIME_INPROGRESS) {
        slime_req_cancel(req);
        slime_req_wait(req, kDropWaitMs);
      }
      all_done = all_done && slime_req_test(req) != SLIME_INPROGRESS;
      slime_req_free(req);
    }
    if (!all_done)
      bytes_.release();
  }
  slime_req_t** at(int i) { return &reqs_[i]; }
  slime_req_t* req(int i) const { return reqs_[i]; }
  uint8_t* byte(int i) { return &bytes_[i]; }

 private:
  std::vector<slime_req_t*> reqs_;
  std::unique_ptr<uint8_t[]> bytes_;
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); i++)
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

void check_posted(slime_status_t st, const std::string& what) {
  if (st != SLIME_OK)
    throw_last_error(what, st);
}

} // namespace

void BackendDlslime::monitoredBarrier(const c10d::BarrierOptions& opts,
                                      bool wait_all_ranks) {
  std::chrono::milliseconds timeout = timeout_of(opts.timeout);
  Clock::time_point deadline = Clock::now() + timeout;
  uint64_t seq = monitor_seq_++;
  uint64_t arrive_tag = kMonitorTagBase + 2 * seq;
  uint64_t release_tag = arrive_tag + 1;
  std::shared_lock<std::shared_mutex> lock(comm_mu_);
  TORCH_CHECK(comm_, "dlslime: monitored_barrier on process group '",
              group_name_, "', which was shut down");
  Requests reqs(size_);

  if (rank_ != 0) {
    check_posted(slime_comm_send(comm_, 0, reqs.byte(0), 1, arrive_tag,
                                 reqs.at(0)),
                 "monitored_barrier");
    check_posted(slime_comm_recv(comm_, 0, reqs.byte(rank_), 1, release_tag,
                                 reqs.at(rank_)),
                 "monitored_barrier");
    slime_status_t st = slime_req_wait(reqs.req(rank_), ms_left(deadline));
    if (st != SLIME_OK)
      std::rethrow_exception(backend_error(
          "dlslime: monitored_barrier: rank " + std::to_string(rank_) +
          " was not released by rank 0 within " +
          std::to_string(timeout.count()) + " ms (" + slime_status_name(st) +
          ")"));
    return;
  }

  for (int r = 1; r < size_; r++)
    check_posted(slime_comm_recv(comm_, r, reqs.byte(r), 1, arrive_tag,
                                 reqs.at(r)),
                 "monitored_barrier");
  std::vector<int> missing;
  for (int r = 1; r < size_; r++) {
    slime_status_t st = slime_req_wait(reqs.req(r), ms_left(deadline));
    if (st != SLIME_OK) {
      missing.push_back(r);
      if (!wait_all_ranks)
        break;
    }
  }
  if (!missing.empty())
    std::rethrow_exception(backend_error(
        "dlslime: monitored_barrier: " +
        std::string(wait_all_ranks ? "Ranks " : "Rank ") +
        rank_list(missing) + " failed to pass monitoredBarrier in " +
        std::to_string(timeout.count()) + " ms"));
  Requests releases(size_);
  for (int r = 1; r < size_; r++)
    check_posted(slime_comm_send(comm_, r, releases.byte(r), 1, release_tag,
                                 releases.at(r)),
                 "monitored_barrier");
  for (int r = 1; r < size_; r++) {
    slime_status_t st = slime_req_wait(releases.req(r), ms_left(deadline));
    if (st != SLIME_OK)
      std::rethrow_exception(backend_error(
          "dlslime: monitored_barrier: releasing rank " + std::to_string(r) +
          " failed (" + slime_status_name(st) + ")"));
  }
}

} // namespace dlslime_shim
