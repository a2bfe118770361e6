// TpAllReduce: the forward pass's tensor-, expert- and context-parallel collectives
// on one rank (the MoE combine all-to-allv and the token all-gather: moe_ep.h; sequence
// parallelism's reduce-scatters and all-gathers; context parallelism's all-gathers:
// context_blocks.h, context_attention.h) — the
// row-parallel partial sums all-reduced over the tp group (the deterministic
// canonical tree by default, so tp ranks reproduce one rank's bits), and while a
// peer over TCP is slow to answer, the start of the next matrix warmed into the
// cache. It counts the time it spends communicating. Layer: engine; a
// StageRunner with tp > 1 owns one. Not thread-safe: the rank's step thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "comm/communicator.h"
#include "model/llama.h"

namespace tessera::engine {

class TpAllReduce final : public model::TensorParallelOps {
 public:
  // `tp` and `pool` must outlive it. prefetch_bytes: how much of the next matrix
  // to warm while waiting on a TCP peer (0 = never).
  TpAllReduce(comm::Communicator& tp, ThreadPool& pool, bool deterministic, int64_t prefetch_bytes)
      : tp_(tp), pool_(pool), deterministic_(deterministic), prefetch_bytes_(prefetch_bytes) {}

  Status AllReduceSum(std::span<float> data, const model::WeightMatrix* next) override;
  Status ReduceScatterSum(std::span<const float> full, std::span<float> piece) override;
  // Expert parallelism: needs SetExpertGroup.
  Status ExpertAllToAllv(std::span<const float> send, std::span<const size_t> rows_to,
                         std::span<float> recv, std::span<const size_t> rows_from,
                         int64_t row_floats) override;
  Status ExpertAllToAllCounts(std::span<const int64_t> send, std::span<int64_t> recv) override;
  Status AllGatherBlocks(std::span<float> data, size_t block) override;
  // Context parallelism: needs SetContextGroup.
  Status ContextAllGatherBlocks(std::span<float> data, size_t block) override;
  Status ContextRingStart(std::span<const float> send, std::span<float> recv) override;
  Status ContextRingProgress() override;
  Status ContextRingWait() override;
  // The EP group (must outlive this), under ep > 1.
  void SetExpertGroup(comm::Communicator* ep) { ep_ = ep; }
  // The cp group (must outlive this), under cp > 1.
  void SetContextGroup(comm::Communicator* cp) { cp_ = cp; }

  // Nanoseconds spent in AllReduceSum since the last call.
  int64_t TakeCommNs() {
    const int64_t ns = comm_ns_;
    comm_ns_ = 0;
    return ns;
  }

 private:
  comm::Communicator& tp_;
  comm::Communicator* ep_ = nullptr;
  comm::Communicator* cp_ = nullptr;
  std::vector<size_t> counts_, displs_, recv_counts_, recv_displs_;
  comm::Request ring_[2];     // the ring step in flight: its send, its receive
  size_t ring_expected_ = 0;  // bytes the receive must bring
  ThreadPool& pool_;
  bool deterministic_;
  int64_t prefetch_bytes_;
  int64_t comm_ns_ = 0;
};

}  // namespace tessera::engine
