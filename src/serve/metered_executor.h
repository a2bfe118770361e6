// MeteredExecutor: a StepExecutor that forwards to the driver's executor and,
// after every collected step, copies the driver rank's communicator ledgers (tp,
// pp, ctl) and its communication time into Metrics. The ledgers are only touched
// by the thread that runs steps, so reading them here — on the scheduler thread,
// between steps — is race-free; /metrics reads the copy. With a Driver to poll
// (SetReportSource), every rank's report goes to Metrics::SetRanks for the live
// view, at most once a second, after a step that leaves none in flight (a due
// poll lowers max_in_flight() to 1 so that a pipeline drains for it). Layer:
// serve. Not thread-safe (one caller, like every StepExecutor).
#pragma once

#include <memory>
#include <vector>

#include "engine/driver.h"
#include "engine/expert_rebalancer.h"
#include "engine/stage_runner.h"
#include "engine/step_executor.h"
#include "serve/metrics.h"

namespace tessera::serve {

class MeteredExecutor final : public engine::StepExecutor {
 public:
  // `groups` may be empty (one rank); all three must outlive this object.
  // `carried`: the totals of the executors this one replaces (after an engine
  // restart), so that the counters never go back.
  MeteredExecutor(engine::StepExecutor& inner, parallel::Groups& groups, Metrics& metrics,
                  CommTotals carried = {})
      : inner_(inner), groups_(groups), metrics_(metrics), carried_(std::move(carried)) {}
  // MoE load statistics: the driver rank's runner (must outlive this object).
  void SetRunner(const engine::StageRunner* runner);
  // The driver whose ranks' reports the live view shows (must outlive this
  // object; normally the executor this one forwards to), polled at most every
  // poll_interval_ns. A failed poll fails the step it follows, as a failed step
  // would (a dead or silent rank).
  void SetReportSource(engine::Driver* driver, int64_t poll_interval_ns = 1'000'000'000) {
    driver_ = driver;
    poll_interval_ns_ = poll_interval_ns;
  }
  // Live expert re-placement (serve --ep-rebalance): after each poll the
  // rebalancer may decide a placement for the load since its last decision, which
  // is applied there and then (Driver::SetExpertPlacement; a poll runs with no
  // step in flight). Needs SetReportSource and SetRunner.
  void SetRebalancer(std::unique_ptr<engine::ExpertRebalancer> rebalancer) {
    rebalancer_ = std::move(rebalancer);
  }
  // Polls every rank's report now (no step may be in flight): the live view's
  // first sample, before any request. Then a re-placement, if one is due.
  Status PollReports();

  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  int32_t kv_partitions() const override { return inner_.kv_partitions(); }
  kv::BlockPlacement kv_placement() const override { return inner_.kv_placement(); }
  int32_t attention_ranks() const override { return inner_.attention_ranks(); }
  // The driver's pipeline depth, but 1 while a poll is due: the scheduler then
  // drains the pipeline so that the poll can run (under --pp and a steady load, one
  // bubble a second; polls need no step in flight).
  int max_in_flight() const override { return PollDue() ? 1 : inner_.max_in_flight(); }
  std::string kv_cache_salt() const override { return inner_.kv_cache_salt(); }
  Status Submit(std::span<const engine::StepEntry> entries, bool all_logits) override {
    return inner_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override;
  double last_step_comm_seconds() const override { return inner_.last_step_comm_seconds(); }
  Result<kv::KvCacheShape> whole_kv_shape() const override { return inner_.whole_kv_shape(); }
  // The blocks' bytes between the ranks count in the comm totals at once.
  Status ReadKvBlocks(std::span<const int32_t> blocks, uint8_t* out) override;
  Status WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) override;
  bool ObserveKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer) override {
    return inner_.ObserveKvLayers(blocks, std::move(observer));
  }
  Status PrepareKvBlocks(std::span<const int32_t> blocks) override {
    return inner_.PrepareKvBlocks(blocks);
  }

  // What /metrics shows: the carried totals plus this executor's.
  CommTotals Totals() const;

 private:
  bool PollDue() const;

  engine::StepExecutor& inner_;
  parallel::Groups& groups_;
  Metrics& metrics_;
  CommTotals carried_;
  const engine::StageRunner* runner_ = nullptr;
  double comm_seconds_ = 0;
  engine::Driver* driver_ = nullptr;
  int64_t poll_interval_ns_ = 0;
  int64_t last_poll_ns_ = 0;
  std::unique_ptr<engine::ExpertRebalancer> rebalancer_;
  std::vector<int64_t> ep_rows_computed_;  // by EP rank, as of the last poll
  // The placement in force as /metrics shows it (CommTotals::expert_home/copies),
  // worked out when it changes rather than at every step's Totals().
  void SummarisePlacement();
  std::vector<int> expert_home_, expert_copies_;
};

}  // namespace tessera::serve
