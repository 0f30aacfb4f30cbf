// backend.cpp - BackendDlslime's life cycle: the communicator, the
// process-wide registry of comm ids, timeouts, posting.
#include "backend.h"

#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include "completions.h"
#include "errors.h"
#include "watched_allocator.h"

namespace dlslime_shim {

namespace {

// A collective's Work waits this much longer than the collective's own
// timeout, so that the core's error (which names what it was waiting
// for) arrives before the Work's generic one.
constexpr std::chrono::milliseconds kCollectiveGrace{2000};

// How long closing the runtime waits for queued Future completions.
constexpr std::chrono::milliseconds kDrainLimit{10000};

// comm id -> the live backend using it.  Lock order: registry, then a
// backend's comm_mu_.
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<uint32_t, BackendDlslime*>& registry() {
  static std::map<uint32_t, BackendDlslime*> live;
  return live;
}

// comm id -> the epoch of the last communicator made with it; guarded
// by the registry's mutex.
std::map<uint32_t, uint64_t>& last_epochs() {
  static std::map<uint32_t, uint64_t> last;
  return last;
}

} // namespace

BackendDlslime::BackendDlslime(int rank, int size, slime_ctx_t* ctx,
                               std::vector<slime_ep_t*> peers,
                               uint32_t comm_id, uint64_t epoch,
                               std::chrono::milliseconds timeout,
                               std::string group_name)
    : c10d::Backend(rank, size),
      comm_id_(comm_id),
      group_name_(std::move(group_name)),
      timeout_ms_(timeout.count()) {
  TORCH_CHECK(ctx, "dlslime: process group '", group_name_,
              "': no context");
  TORCH_CHECK(static_cast<int>(peers.size()) == size, "dlslime: process ",
              "group '", group_name_, "': ", peers.size(),
              " endpoints for ", size, " ranks");
  TORCH_CHECK(comm_id > 0 && comm_id <= 0xffff, "dlslime: comm id ", comm_id,
              " is outside 1..65535");
  TORCH_CHECK(timeout.count() > 0, "dlslime: process group '", group_name_,
              "': the timeout must be positive, got ", timeout.count(),
              " ms");
  watch_cpu_allocator();
  std::lock_guard<std::mutex> registry_lock(registry_mutex());
  auto taken = registry().find(comm_id);
  TORCH_CHECK(taken == registry().end(), "dlslime: comm id ", comm_id,
              " of process group '", group_name_,
              "' is already used by the live process group '",
              taken == registry().end() ? "" : taken->second->group_name(),
              "' in this process");
  TORCH_CHECK(epoch > last_epochs()[comm_id], "dlslime: process group '",
              group_name_, "': epoch ", epoch, " of comm id ", comm_id,
              " is not above the last one, ", last_epochs()[comm_id]);
  slime_status_t st = slime_comm_create(
      ctx, comm_id, static_cast<uint32_t>(epoch & 0xff), rank, size,
      peers.data(), timeout.count(), &comm_);
  if (st != SLIME_OK)
    throw_last_error("creating the communicator of process group '" +
                     group_name_ + "'", st);
  registry()[comm_id] = this;
  last_epochs()[comm_id] = epoch;
  init();
}

BackendDlslime::~BackendDlslime() {
  shutdown();
}

std::string BackendDlslime::comm_id_owner(uint32_t comm_id) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(comm_id);
  return it == registry().end() ? std::string() : it->second->group_name();
}

uint64_t BackendDlslime::comm_id_last_epoch(uint32_t comm_id) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = last_epochs().find(comm_id);
  return it == last_epochs().end() ? 0 : it->second;
}

void BackendDlslime::shutdown_all() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    // destroy_comm_locked erases from the registry.
    while (!registry().empty())
      registry().begin()->second->destroy_comm_locked();
  }
  // The runtime closes next: the Futures of what that failed, and of what
  // completed before, are finished first.  Not under the registry's
  // mutex: a Future's callback may use a backend.
  if (!drain_completions(kDrainLimit))
    TORCH_WARN("dlslime: closing with Future callbacks still running after ",
               kDrainLimit.count(), " ms");
}

void BackendDlslime::destroy_comm_locked() {
  std::unique_lock<std::shared_mutex> lock(comm_mu_);
  if (!comm_)
    return;
  // Fails what is still queued with SLIME_ERR_CLOSED; those Works'
  // callbacks run and report it.
  slime_comm_destroy(comm_);
  comm_ = nullptr;
  auto it = registry().find(comm_id_);
  if (it != registry().end() && it->second == this)
    registry().erase(it);
}

void BackendDlslime::shutdown() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  destroy_comm_locked();
}

void BackendDlslime::abort() {
  shutdown();
}

bool BackendDlslime::is_shut_down() {
  std::shared_lock<std::shared_mutex> lock(comm_mu_);
  return comm_ == nullptr;
}

c10::intrusive_ptr<c10d::Backend::Options> BackendDlslime::getBackendOptions() {
  auto opts = c10::make_intrusive<Options>(
      kName, std::chrono::milliseconds(timeout_ms_.load()));
  opts->group_name = group_name_;
  return opts;
}

void BackendDlslime::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "dlslime: setTimeout: the timeout must "
              "be positive, got ", timeout.count(), " ms");
  timeout_ms_.store(timeout.count());
  std::shared_lock<std::shared_mutex> lock(comm_mu_);
  if (comm_)
    slime_comm_set_timeout(comm_, timeout.count());
}

void BackendDlslime::enableCollectivesTiming() {
  timing_.store(true);
}

void BackendDlslime::setSequenceNumberForGroup() {
  // Every rank starts its communicator at 0: nothing to agree on.
}

uint64_t BackendDlslime::getSequenceNumberForGroup() {
  return seq_.load();
}

std::chrono::milliseconds BackendDlslime::timeout_of(
    std::chrono::milliseconds op) const {
  return op == c10d::kUnsetTimeout
      ? std::chrono::milliseconds(timeout_ms_.load())
      : op;
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::post(WorkSpec spec,
                                                    Issue issue) {
  OpName what = spec.what;
  bool poster_waits = spec.poster_waits;
  spec.timed = timing_.load();
  auto work = c10::make_intrusive<WorkDlslime>(rank_, std::move(spec));
  slime_req_t* req = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(comm_mu_);
    TORCH_CHECK(comm_, "dlslime: ", what.text(), " on process group '",
                group_name_, "', which was shut down (destroy_process_group)");
    if (poster_waits)
      slime_comm_next_waited(comm_);
    slime_status_t st = issue(comm_, &req);
    if (st != SLIME_OK)
      throw_last_error(what.text(), st);
  }
  work->arm(req);
  return work;
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::post_collective(
    WorkSpec spec, std::chrono::milliseconds op_timeout, Issue issue) {
  spec.timeout = timeout_of(op_timeout) + kCollectiveGrace;
  auto work = post(std::move(spec), issue);
  seq_.fetch_add(1);
  return work;
}

c10::intrusive_ptr<c10d::Work> BackendDlslime::post_collectives(
    WorkSpec spec, std::chrono::milliseconds op_timeout,
    const std::vector<KeptIssue>& issues) {
  // A communicator runs its collectives one at a time in post order, and
  // once one fails every later one fails too: the last one's completion
  // and status are those of the whole.  The earlier ones' Works are
  // dropped at once; each keeps the buffers alive until its request
  // completes (see ~WorkDlslime).  Arguments were checked before the
  // first post, so a later post fails only when the communicator is gone.
  // Only the last carries spec's synchronous hint (poster_waits): a wait
  // runs only the collective at the head of the queue, so the earlier
  // ones must wake the worker.
  for (size_t i = 0; i + 1 < issues.size(); i++) {
    WorkSpec earlier;
    earlier.type = spec.type;
    earlier.profiling_title = spec.profiling_title;
    earlier.what = spec.what;
    earlier.keep_alive = spec.keep_alive;
    post_collective(std::move(earlier), op_timeout, issues[i]);
  }
  return post_collective(std::move(spec), op_timeout, issues.back());
}

int BackendDlslime::source_of(slime_req_t* req) {
  std::shared_lock<std::shared_mutex> lock(comm_mu_);
  TORCH_CHECK(comm_, "dlslime: the source rank of a receive on process "
              "group '", group_name_, "', which was shut down");
  return slime_comm_req_source(comm_, req);
}

} // namespace dlslime_shim
