// monitored_barrier.cpp - a barrier that names the ranks that did not
// arrive, in Gloo's words (torch's tests match them): every rank reports
// to rank 0, which waits for them up to the timeout and then releases them
// all, or tells those that arrived that it failed.  Only rank 0 applies
// the barrier's timeout, as in Gloo, so that it is the one to say which
// rank is missing; the others wait for its word up to the group's timeout
// as well.  Runs on the communicator's point-to-point calls in tags above
// the users' range, one pair of tags per call so a late report never
// counts for the next one.
#include <algorithm>
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
// Rank 0's word to a rank that arrived (a received byte is never 0 by
// accident: the buffers start zeroed).
constexpr uint8_t kPassed = 1;
constexpr uint8_t kFailed = 2;

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

// One call: its communicator, tags and timeout.
struct Call {
  slime_comm_t* comm;
  int rank;
  int size;
  uint64_t arrive_tag;
  uint64_t release_tag;
  std::chrono::milliseconds timeout;
  Clock::time_point start;
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); i++)
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

void check_posted(slime_status_t st) {
  if (st != SLIME_OK)
    throw_last_error("monitored_barrier", st);
}

[[noreturn]] void fail(const std::string& message) {
  std::rethrow_exception(backend_error("dlslime: monitored_barrier: " +
                                       message));
}

// A rank other than 0: reports, then waits up to wait_ms for rank 0's word.
void arrive_and_wait(const Call& c, int64_t wait_ms) {
  Requests reqs(2);
  *reqs.byte(0) = kPassed;
  check_posted(slime_comm_send(c.comm, 0, reqs.byte(0), 1, c.arrive_tag,
                               reqs.at(0)));
  check_posted(slime_comm_recv(c.comm, 0, reqs.byte(1), 1, c.release_tag,
                               reqs.at(1)));
  slime_status_t st = slime_req_wait(reqs.req(1), wait_ms);
  if (st == SLIME_OK && *reqs.byte(1) == kPassed)
    return;
  std::string why = st == SLIME_OK
      ? "rank 0 reported that another rank did not arrive"
      : status_message("waiting for rank 0", st,
                       st == SLIME_ERR_TIMEOUT
                           ? "no word within " + std::to_string(wait_ms) +
                               " ms"
                           : std::string(slime_req_error(reqs.req(1))));
  fail("Rank " + std::to_string(c.rank) + " successfully reached "
       "monitoredBarrier, but received errors while waiting for send/recv "
       "from rank 0. Please check rank 0's error for the faulty rank.\n " +
       why);
}

// Rank 0: waits for the reports; returns why the barrier failed, in
// Gloo's words ("" if every rank arrived).  Without wait_all_ranks it
// stops at the first missing rank, and blames itself when its time ran out
// before it could wait for a rank.
std::string collect(const Call& c, Requests& reqs, bool wait_all_ranks) {
  Clock::time_point deadline = c.start + c.timeout;
  std::vector<int> missing, arrived;
  for (int r = 1; r < c.size; r++) {
    int64_t left = ms_left(deadline);
    if (!wait_all_ranks && left == 0 &&
        slime_req_test(reqs.req(r)) == SLIME_INPROGRESS)
      return "Rank 0 timed out in monitoredBarrier after " +
          std::to_string(c.timeout.count()) + " ms.\n" +
          (arrived.empty()
               ? std::string("No ranks successfully processed in "
                             "monitoredBarrier.")
               : "Successfully processed ranks: " + rank_list(arrived));
    if (slime_req_wait(reqs.req(r), left) == SLIME_OK) {
      arrived.push_back(r);
      continue;
    }
    missing.push_back(r);
    if (!wait_all_ranks)
      break;
  }
  if (missing.empty())
    return "";
  return (wait_all_ranks ? "Ranks " : "Rank ") + rank_list(missing) +
      " failed to pass monitoredBarrier in " +
      std::to_string(c.timeout.count()) + " ms";
}

// Rank 0's word to every rank whose report came: kPassed or kFailed.
void tell(const Call& c, Requests& reports, uint8_t word, int64_t wait_ms) {
  Requests sends(c.size);
  for (int r = 1; r < c.size; r++) {
    if (slime_req_test(reports.req(r)) != SLIME_OK)
      continue;
    *sends.byte(r) = word;
    check_posted(slime_comm_send(c.comm, r, sends.byte(r), 1, c.release_tag,
                                 sends.at(r)));
  }
  for (int r = 1; r < c.size; r++) {
    if (!sends.req(r))
      continue;
    slime_status_t st = slime_req_wait(sends.req(r), wait_ms);
    if (st != SLIME_OK && word == kPassed)
      fail("releasing rank " + std::to_string(r) + " failed: " +
           status_message("send", st, slime_req_error(sends.req(r))));
  }
}

} // namespace

void BackendDlslime::monitoredBarrier(const c10d::BarrierOptions& opts,
                                      bool wait_all_ranks) {
  uint64_t seq = monitor_seq_++;
  std::chrono::milliseconds group_timeout(timeout_ms_.load());
  std::shared_lock<std::shared_mutex> lock(comm_mu_);
  TORCH_CHECK(comm_, "dlslime: monitored_barrier on process group '",
              group_name_, "', which was shut down");
  Call c{comm_, rank_, size_, kMonitorTagBase + 2 * seq,
         kMonitorTagBase + 2 * seq + 1, timeout_of(opts.timeout),
         Clock::now()};
  if (rank_ != 0) {
    arrive_and_wait(c, std::max(c.timeout, group_timeout).count());
    return;
  }
  Requests reports(size_);
  for (int r = 1; r < size_; r++)
    check_posted(slime_comm_recv(comm_, r, reports.byte(r), 1, c.arrive_tag,
                                 reports.at(r)));
  std::string failure = collect(c, reports, wait_all_ranks);
  if (failure.empty()) {
    tell(c, reports, kPassed, group_timeout.count());
    return;
  }
  tell(c, reports, kFailed, kDropWaitMs);
  fail(failure);
}

} // namespace dlslime_shim
