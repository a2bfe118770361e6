#include "engine/expert_rebalancer.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace tessera::engine {

std::vector<int64_t> ExpertLoad(const std::vector<RankReport>& reports, std::optional<size_t> step,
                                const parallel::Partition& plan) {
  std::vector<int64_t> per_expert;
  for (const RankReport& r : reports) {
    if (r.tp_rank % plan.ep != 0) continue;
    const std::vector<int64_t>* rows = &r.expert_rows_total;
    if (step) {
      if (*step >= r.traffic.size()) continue;
      rows = &r.traffic[*step].expert_rows;
    }
    per_expert.resize(std::max(per_expert.size(), rows->size()), 0);
    for (size_t e = 0; e < rows->size(); ++e) per_expert[e] += (*rows)[e];
  }
  return per_expert;
}

double BusiestOverMean(const parallel::ExpertPlacement& placement, const std::vector<int64_t>& load,
                       int ep) {
  const std::vector<double> rows = parallel::ExpectedRankRows(placement, load, ep);
  const double total = std::accumulate(rows.begin(), rows.end(), 0.0);
  if (total <= 0) return 1;
  return *std::max_element(rows.begin(), rows.end()) / (total / static_cast<double>(ep));
}

ExpertRebalancer::ExpertRebalancer(const parallel::Partition& plan, RebalanceOptions options)
    : plan_(plan), options_(options), placement_(plan.expert_placement) {
  TESSERA_CHECK(plan.ep > 1);
}

std::optional<parallel::ExpertPlacement> ExpertRebalancer::Consider(
    const std::vector<RankReport>& reports, int64_t now_ns) {
  const std::vector<int64_t> load = ExpertLoad(reports, std::nullopt, plan_);
  bool restarted = load.size() != window_start_.size() || window_start_ns_ < 0;
  for (size_t e = 0; !restarted && e < load.size(); ++e) restarted = load[e] < window_start_[e];
  if (restarted) {
    window_start_ = load;
    window_start_ns_ = now_ns;
    return std::nullopt;
  }
  if (now_ns - window_start_ns_ < options_.interval_ns) return std::nullopt;
  std::vector<int64_t> window(load.size());
  for (size_t e = 0; e < load.size(); ++e) window[e] = load[e] - window_start_[e];
  if (std::accumulate(window.begin(), window.end(), int64_t{0}) < options_.min_rows) {
    return std::nullopt;  // too few rows to judge: the window grows
  }
  window_start_ = load;
  window_start_ns_ = now_ns;
  ++stats_.decisions;
  parallel::ExpertPlacement balanced =
      parallel::BalanceExperts(window, plan_.ep, plan_.ep_redundant);
  const double before = BusiestOverMean(placement_, window, plan_.ep);
  const double after = BusiestOverMean(balanced, window, plan_.ep);
  if (balanced.holders == placement_.holders || after > before * (1 - options_.min_gain)) {
    return std::nullopt;
  }
  stats_.before_ratio = before;
  stats_.after_ratio = after;
  return balanced;
}

void ExpertRebalancer::Applied(const parallel::ExpertPlacement& placement, double seconds) {
  placement_ = placement;
  ++stats_.rebalances;
  stats_.last_seconds = seconds;
}

}  // namespace tessera::engine
