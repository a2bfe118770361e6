#include "engine/expert_rebalancer.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace tessera::engine {

// Whether `r`'s expert counts enter the load: EP rank 0 of each tp EP group counts
// its group's tokens (its peers the same ones); under data-parallel attention each
// rank counts its own tokens, so every rank does.
namespace {
bool CountsLoad(const RankReport& r, const parallel::Partition& plan) {
  return plan.dp > 1 || r.tp_rank % plan.ep == 0;
}
}  // namespace

std::vector<int64_t> ExpertLoad(const std::vector<RankReport>& reports, std::optional<size_t> step,
                                const parallel::Partition& plan) {
  std::vector<int64_t> per_expert;
  for (const RankReport& r : reports) {
    if (!CountsLoad(r, plan)) continue;
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

std::vector<std::vector<int64_t>> ExpertLoadByLayer(const std::vector<RankReport>& reports,
                                                    const parallel::Partition& plan,
                                                    int64_t num_experts) {
  const int64_t num_layers = plan.stage_layers.empty() ? 0 : plan.stage_layers.back().end;
  const auto n = static_cast<size_t>(num_experts);
  std::vector<std::vector<int64_t>> load(static_cast<size_t>(num_layers),
                                         std::vector<int64_t>(n, 0));
  for (const RankReport& r : reports) {
    if (!CountsLoad(r, plan) || r.stage < 0 || r.stage >= plan.pp) continue;
    const parallel::LayerRange layers = plan.stage_layers[static_cast<size_t>(r.stage)];
    for (int64_t li = 0; li < layers.size(); ++li) {
      for (size_t e = 0; e < n; ++e) {
        const size_t i = static_cast<size_t>(li) * n + e;
        if (i < r.expert_rows_by_layer.size()) {
          load[static_cast<size_t>(layers.begin + li)][e] += r.expert_rows_by_layer[i];
        }
      }
    }
  }
  return load;
}

ExpertRebalancer::ExpertRebalancer(const parallel::Partition& plan, RebalanceOptions options)
    : plan_(plan),
      options_(options),
      placement_(plan.expert_placement),
      num_experts_(static_cast<int64_t>(plan.expert_placement.Of(0).size())) {
  TESSERA_CHECK(plan.ep > 1);
}

std::optional<parallel::ExpertPlacement> ExpertRebalancer::Consider(
    const std::vector<RankReport>& reports, int64_t now_ns) {
  const std::vector<std::vector<int64_t>> load = ExpertLoadByLayer(reports, plan_, num_experts_);
  bool restarted = load.size() != window_start_.size() || window_start_ns_ < 0;
  for (size_t l = 0; !restarted && l < load.size(); ++l) {
    for (size_t e = 0; e < load[l].size(); ++e) restarted |= load[l][e] < window_start_[l][e];
  }
  if (restarted) {
    window_start_ = load;
    window_start_ns_ = now_ns;
    return std::nullopt;
  }
  if (now_ns - window_start_ns_ < options_.interval_ns) return std::nullopt;
  std::vector<std::vector<int64_t>> window = load;
  int64_t rows = 0;
  for (size_t l = 0; l < load.size(); ++l) {
    for (size_t e = 0; e < load[l].size(); ++e) {
      window[l][e] -= window_start_[l][e];
      rows += window[l][e];
    }
  }
  if (rows < options_.min_rows) return std::nullopt;  // too few to judge: the window grows
  window_start_ = load;
  window_start_ns_ = now_ns;
  ++stats_.decisions;
  parallel::ExpertPlacement balanced =
      parallel::BalanceExpertsByLayer(window, plan_.ep, plan_.ep_redundant);
  const double before = parallel::BusiestOverMean(placement_, window, plan_.ep);
  const double after = parallel::BusiestOverMean(balanced, window, plan_.ep);
  if (after > before * (1 - options_.min_gain)) return std::nullopt;
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
