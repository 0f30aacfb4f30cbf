// backend.h - BackendDlslime, the c10d::Backend of torch.distributed's
// "dlslime" backend.
//
// One object per process group: it owns one libdlslime communicator
// (slime_comm_t) over endpoints of the process-wide context that
// dlslime_torch.runtime made and connected (through the c10d Store).  The
// ops translate tensors into (pointer, size, dtype) for the C API and
// return WorkDlslime; the algorithms live in the core.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <shared_mutex>
#include <string>
#include <vector>

#include <c10/util/FunctionRef.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <dlslime/dlslime.h>

#include "work.h"

namespace dlslime_shim {

// The communicator's point-to-point tags have 39 bits: users' tags stay
// below this one, the backend's own (monitored_barrier) start at it.
constexpr uint64_t kOwnTagBase = uint64_t{1} << 38;

class BackendDlslime : public c10d::Backend {
 public:
  static constexpr const char* kName = "dlslime";

  // peers[r]: the endpoint to rank r (peers[rank] unused).  comm_id must
  // be the same on every rank and not used by a live communicator of
  // this process (see comm_id_owner).  epoch (the same on every rank)
  // counts the communicators made with comm_id; its low 8 bits must
  // differ from those of every member's last one (comm_id_last_epoch),
  // so that the old one's messages never match the new one's.
  BackendDlslime(int rank, int size, slime_ctx_t* ctx,
                 std::vector<slime_ep_t*> peers, uint32_t comm_id,
                 uint64_t epoch, std::chrono::milliseconds timeout,
                 std::string group_name);
  ~BackendDlslime() override;

  // The group name of the live communicator using comm_id in this
  // process, or "" if none does.
  static std::string comm_id_owner(uint32_t comm_id);
  // The epoch of the last communicator made with comm_id in this
  // process (0 if none was).
  static uint64_t comm_id_last_epoch(uint32_t comm_id);
  // Shuts down every live BackendDlslime and lets the Future completions
  // queued by then run (before the context is closed at exit).
  static void shutdown_all();

  uint32_t comm_id() const { return comm_id_; }
  const std::string& group_name() const { return group_name_; }
  bool is_shut_down();

  const std::string getBackendName() const override { return kName; }
  // supportsCoalescing stays false, as Gloo's: torch's coalescing manager
  // then calls the *_coalesced ops below, one collective each.
  // supportsSplitting stays false too: torch 2.13's split_group splits
  // only accelerator backends, and a split needs the Python rendezvous
  // of dlslime_torch.backend (see _create_backend).
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;
  // Works time themselves from then on (Work.getDuration), as NCCL's do.
  void enableCollectivesTiming() override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  // ops_p2p.cpp
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors, int tag) override;

  // ops_reduce.cpp
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;

  // ops_gather.cpp
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;

  // ops_alltoall.cpp
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;

  // ops_coalesced.cpp
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // ops_sparse.cpp (allreduce sends sparse tensors there too, as Gloo's)
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;

  // monitored_barrier.cpp
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool wait_all_ranks) override;

 private:
  // Posts the C operation; called before post returns, so it refers to
  // the caller's lambda (a std::function would allocate for it per op).
  using Issue = c10::function_ref<slime_status_t(slime_comm_t*, slime_req_t**)>;
  // An Issue kept in a list until the list is posted (coalesced ops).
  using KeptIssue = std::function<slime_status_t(slime_comm_t*, slime_req_t**)>;

  // Posts one C operation (issue) and returns its Work; throws with the
  // C library's text if posting fails.
  c10::intrusive_ptr<c10d::Work> post(WorkSpec spec, Issue issue);
  // Posts a collective: counts it and bounds its Work's wait().
  c10::intrusive_ptr<c10d::Work> post_collective(
      WorkSpec spec, std::chrono::milliseconds op_timeout, Issue issue);
  // Posts several collectives back to back (one per dtype of a coalesced
  // reduction); the Work of the last one stands for them all.
  c10::intrusive_ptr<c10d::Work> post_collectives(
      WorkSpec spec, std::chrono::milliseconds op_timeout,
      const std::vector<KeptIssue>& issues);
  // Every rank's record of its sparse tensor (ops_sparse.cpp), gathered
  // and waited for.
  at::Tensor gather_sparse_meta(const at::Tensor& mine,
                                std::chrono::milliseconds timeout,
                                const char* op);
  // The timeout an op runs under: its own if set, else the group's.
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds op) const;
  // The rank a completed recv-from-any came from.
  int source_of(slime_req_t* req);
  // Destroys the communicator; caller holds the registry lock.
  void destroy_comm_locked();

  const uint32_t comm_id_;
  const std::string group_name_;
  std::atomic<int64_t> timeout_ms_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> timing_{false};
  uint64_t monitor_seq_ = 0;
  // Shared while an op posts on comm_, exclusive to destroy it.
  std::shared_mutex comm_mu_;
  slime_comm_t* comm_ = nullptr;
};

} // namespace dlslime_shim
