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
  int max_in_flight() const override;
  std::string kv_cache_salt() const override;
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override;
  Result<std::span<const float>> Collect() override;
  double last_step_comm_seconds() const override;

  // Stops every worker and returns all ranks' reports, by rank.
  Result<std::vector<RankReport>> Shutdown();
  // Every rank's report so far, by rank, while the workers go on serving (a
  // round trip on the ctl group; one rank: no message). Only with no step in
  // flight (InvalidArgument otherwise); a dead or silent rank is an error as for
  // a step.
  Result<std::vector<RankReport>> PollReports();
  // Steps submitted and not yet collected.
  int steps_in_flight() const { return static_cast<int>(in_flight_.size()); }

 private:
  // Sends `kind` (kStop or kReport) through the pipeline and collects every rank's report.
  Result<std::vector<RankReport>> ExchangeReports(parallel::StepKind kind);

  StageRunner& runner_;
  std::deque<StepMessage> in_flight_;
  std::vector<float> logits_;
  uint64_t next_step_id_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera::engine
