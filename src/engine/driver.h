// Driver: the driver rank's StepExecutor — the scheduler's view of a whole
// tensor/pipeline-parallel plan (or of one rank). Submit turns the scheduler's
// entries into a StepMessage and sends it to the first stage's ranks (and runs
// it itself when the driver is in that stage, pp = 1); Collect takes the oldest
// outstanding step's gathered logits, running the last stage's share when pp > 1
// (the driver is the last stage's tp rank 0). Up to pp steps may be outstanding.
// Shutdown() stops the workers and collects their reports (once, after the last
// step); PollReports() collects them between steps while the workers go on. Layer: engine. Not
// thread-safe: one caller, like every StepExecutor.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/rank_report.h"
#include "engine/stage_runner.h"
#include "engine/step_executor.h"

namespace tessera::engine {

class Driver final : public StepExecutor {
 public:
  // Over the driver rank's runner (must outlive the driver).
  explicit Driver(StageRunner& runner);
  ~Driver() override;

  int64_t vocab_size() const override;
  int32_t num_kv_blocks() const override;
  int32_t kv_block_size() const override;
  int32_t kv_partitions() const override;
  kv::BlockPlacement kv_placement() const override;
  int32_t attention_ranks() const override;
  int max_in_flight() const override;
  std::string kv_cache_salt() const override;
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override;
  Result<std::span<const float>> Collect() override;
  double last_step_comm_seconds() const override;
  // Every rank's share of the blocks travels on the ctl group (kKvRead /
  // kKvWrite); not under context parallelism or data-parallel attention.
  Result<kv::KvCacheShape> whole_kv_shape() const override;
  Status ReadKvBlocks(std::span<const int32_t> blocks, uint8_t* out) override;
  Status WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) override;
  // Every rank maps its share on its own background thread (kKvPrepare); skipped
  // with steps in flight and under pp, cp or data-parallel attention.
  Status PrepareKvBlocks(std::span<const int32_t> blocks) override;
  // Not under pp, cp or data-parallel attention. Over tp ranks each worker sends
  // the driver its share of each layer inside the step (a kKvStream message names
  // the blocks first), which the driver places into whole-model pieces.
  bool ObserveKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer) override;

  // Stops every worker and returns all ranks' reports, by rank.
  Result<std::vector<RankReport>> Shutdown();
  // Every rank's report so far, by rank, while the workers go on serving (a
  // round trip on the ctl group; one rank: no message). Only with no step in
  // flight (InvalidArgument otherwise); a dead or silent rank is an error as for
  // a step.
  Result<std::vector<RankReport>> PollReports();
  // Expert parallelism, live: every rank holds the experts `placement` gives it
  // before the next step (StageRunner::SetExpertPlacement), and every rank's report
  // after it comes back. Only with no step in flight. The placement is checked
  // here first (InvalidArgument, no rank touched); a rank failing to apply it is
  // an error as for a step (the group is then unusable).
  Result<std::vector<RankReport>> SetExpertPlacement(const parallel::ExpertPlacement& placement);
  // Steps submitted and not yet collected.
  int steps_in_flight() const { return static_cast<int>(in_flight_.size()); }

 private:
  // Sends `request` (kStop, kReport or kPlacement; its step id is set here) through
  // the pipeline, runs `local` (may be null) on this rank, and collects every
  // rank's report.
  Result<std::vector<RankReport>> ExchangeReports(StepMessage request,
                                                  const std::function<Status()>& local = {});

  // kKvRead / kKvWrite: checks, then sends `request` through the pipeline (as
  // ExchangeReports) and returns every rank's place in the whole block, by rank.
  Result<std::vector<kv::KvShardSlice>> BeginKvMove(StepMessage request);
  // A kKv* message to the first stage's ranks, its block ids checked first.
  Status SendKvMessage(StepMessage& request);

  StageRunner& runner_;
  std::vector<uint8_t> kv_scratch_;  // one rank's block
  std::deque<StepMessage> in_flight_;
  std::vector<float> logits_;
  uint64_t next_step_id_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera::engine
