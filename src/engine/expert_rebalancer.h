// ExpertRebalancer: live hot-expert re-placement for a serving engine under --ep
// with replica slots (issue 30; EPLB-style, per layer). Fed every rank's reports
// as the server polls them (RankReport::expert_rows_by_layer: the rows routed to
// each expert in each layer), it keeps the load routed since its last decision.
// Once `interval_ns` has passed and that window holds at least `min_rows` rows, it
// decides: the per-layer placement parallel::BalanceExpertsByLayer computes for
// the window's load, if that lowers the busiest EP rank's expected rows (summed
// over the layers: each layer waits for its busiest rank) by at least `min_gain`
// against the placement in force; otherwise none, and a new window starts either
// way. The caller applies a decision between steps (Driver::SetExpertPlacement)
// and says so (Applied). Replicas hold the file's bytes, so output never changes.
// Layer: engine. Plain values; one caller.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/rank_report.h"
#include "parallel/expert_placement.h"
#include "parallel/partition.h"

namespace tessera::engine {

// The (token, choice) rows routed to each expert, summed over the MoE layers (one
// rank per EP group and stage counts its group's routing), for one recorded step
// (reports' traffic) or the whole run (nullopt).
std::vector<int64_t> ExpertLoad(const std::vector<RankReport>& reports, std::optional<size_t> step,
                                const parallel::Partition& plan);

// The same for each layer of the model ([num_layers][num_experts]): every stage's
// layers from one rank per EP group (RankReport::expert_rows_by_layer).
std::vector<std::vector<int64_t>> ExpertLoadByLayer(const std::vector<RankReport>& reports,
                                                    const parallel::Partition& plan,
                                                    int64_t num_experts);

struct RebalanceOptions {
  int64_t interval_ns = 10'000'000'000;  // between decisions
  int64_t min_rows = 4096;               // a window's rows before it is trusted
  double min_gain = 0.05;                // busiest rank's expected rows: at least 5% fewer
};

struct RebalanceStats {
  int64_t decisions = 0;    // windows judged
  int64_t rebalances = 0;   // placements applied
  double last_seconds = 0;  // the last re-placement's pause, driver's view
  double before_ratio = 1;  // the last re-placement's window: busiest / mean, old placement
  double after_ratio = 1;   //   ... and under the new one (expected; parallel::BusiestOverMean)
};

class ExpertRebalancer {
 public:
  // `plan` must have ep > 1 (its placement is the one in force at start).
  ExpertRebalancer(const parallel::Partition& plan, RebalanceOptions options);

  // The placement to apply now, if any (see the file comment). Counters that went
  // back (an engine restart) start a new window.
  std::optional<parallel::ExpertPlacement> Consider(const std::vector<RankReport>& reports,
                                                    int64_t now_ns);
  // `placement` is in force since a re-placement that took `seconds`.
  void Applied(const parallel::ExpertPlacement& placement, double seconds);

  const parallel::ExpertPlacement& placement() const { return placement_; }
  const RebalanceStats& stats() const { return stats_; }

 private:
  parallel::Partition plan_;
  RebalanceOptions options_;
  parallel::ExpertPlacement placement_;
  int64_t num_experts_;
  std::vector<std::vector<int64_t>> window_start_;  // the load at the window's start
  int64_t window_start_ns_ = -1;
  RebalanceStats stats_;
};

}  // namespace tessera::engine
