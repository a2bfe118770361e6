// ExpertRebalancer: when it re-places hot experts (a window old and full enough,
// a gain of at least min_gain), when it keeps the placement, and how it reads the
// load from the ranks' reports (one rank per EP group and stage).
#include "engine/expert_rebalancer.h"

#include <gtest/gtest.h>

#include <vector>

namespace tessera::engine {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

// A plan of 2 layers (one a stage under pp 2) and 4 experts.
parallel::Partition EpPlan(int tp, int ep, int pp, int redundant) {
  parallel::Partition plan;
  plan.tp = tp;
  plan.ep = ep;
  plan.pp = pp;
  plan.ep_redundant = redundant;
  plan.stage_layers = pp == 1 ? std::vector<parallel::LayerRange>{{0, 2}}
                              : std::vector<parallel::LayerRange>{{0, 1}, {1, 2}};
  plan.expert_placement = parallel::ContiguousPlacement(4, ep);
  return plan;
}

// Every rank of `plan` with rows[l] routed to each expert of layer l so far (its
// EP group's routing: the same on each of the group's ranks).
std::vector<RankReport> Reports(const parallel::Partition& plan,
                                const std::vector<std::vector<int64_t>>& rows) {
  std::vector<RankReport> reports;
  for (int r = 0; r < plan.world_size(); ++r) {
    RankReport report;
    report.rank = r;
    report.tp_rank = plan.TpRankOf(r);
    report.stage = plan.StageOf(r);
    const parallel::LayerRange layers = plan.stage_layers[static_cast<size_t>(report.stage)];
    for (int64_t l = layers.begin; l < layers.end; ++l) {
      const std::vector<int64_t>& layer = rows[static_cast<size_t>(l)];
      report.expert_rows_by_layer.insert(report.expert_rows_by_layer.end(), layer.begin(),
                                         layer.end());
    }
    reports.push_back(report);
  }
  return reports;
}

// The same load in both layers.
std::vector<RankReport> Reports(const parallel::Partition& plan, const std::vector<int64_t>& rows) {
  return Reports(plan, std::vector<std::vector<int64_t>>{rows, rows});
}

TEST(ExpertRebalancerTest, LoadCountsEachEpGroupAndStageOnce) {
  const parallel::Partition plan = EpPlan(4, 2, 2, 1);  // 2 groups a stage, 2 stages
  const auto load = ExpertLoadByLayer(Reports(plan, {{1, 2, 3, 4}, {5, 6, 7, 8}}), plan, 4);
  EXPECT_EQ(load, (std::vector<std::vector<int64_t>>{{2, 4, 6, 8}, {10, 12, 14, 16}}));
}

TEST(ExpertRebalancerTest, CopiesTheHotExpertsOnceTheWindowIsFullAndOld) {
  const parallel::Partition plan = EpPlan(2, 2, 1, 1);
  ExpertRebalancer r(plan, {.interval_ns = 10 * kSecond, .min_rows = 2000, .min_gain = 0.05});
  EXPECT_FALSE(r.Consider(Reports(plan, {0, 0, 0, 0}), 0));  // the window starts
  // Experts 0 and 1 (rank 0's) take 90% of the rows, but too early...
  EXPECT_FALSE(r.Consider(Reports(plan, {500, 400, 50, 50}), 5 * kSecond));
  // ... and then too few rows (980 a layer): the window grows on.
  EXPECT_FALSE(r.Consider(Reports(plan, {450, 450, 40, 40}), 11 * kSecond));
  const auto placement = r.Consider(Reports(plan, {500, 450, 50, 50}), 12 * kSecond);
  ASSERT_TRUE(placement);
  // In each layer rank 1's one free slot takes a copy of expert 0: 250 + 450 rows
  // against 250 + 100, the busiest rank at 4/3 of the mean instead of 950 / 525.
  ASSERT_TRUE(placement->per_layer());
  EXPECT_EQ(placement->layers[0][0], (std::vector<int>{0, 1}));
  EXPECT_EQ(placement->HeldBy(1, 1).size(), 3u);
  EXPECT_DOUBLE_EQ(r.stats().before_ratio, 950.0 / 525);
  EXPECT_DOUBLE_EQ(r.stats().after_ratio, 700.0 / 525);
  EXPECT_EQ(r.stats().decisions, 1);
  r.Applied(*placement, 0.01);
  EXPECT_EQ(r.stats().rebalances, 1);
  EXPECT_EQ(r.placement().layers, placement->layers);
  // The same skew again: the placement in force is already the balanced one.
  EXPECT_FALSE(r.Consider(Reports(plan, {1000, 900, 100, 100}), 23 * kSecond));
  EXPECT_EQ(r.stats().decisions, 2);
}

// A layer's hot experts are its own: here layer 0 favours rank 0's experts and
// layer 1 rank 1's, so the load summed over the layers is flat and one table for
// every layer could not help; a table per layer does.
TEST(ExpertRebalancerTest, EachLayerGetsItsOwnCopies) {
  const parallel::Partition plan = EpPlan(2, 2, 1, 1);
  ExpertRebalancer r(plan, {.interval_ns = kSecond, .min_rows = 100, .min_gain = 0.05});
  EXPECT_FALSE(r.Consider(Reports(plan, {{0, 0, 0, 0}, {0, 0, 0, 0}}), 0));
  const auto placement =
      r.Consider(Reports(plan, {{800, 100, 50, 50}, {50, 50, 100, 800}}), 2 * kSecond);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->layers[0][0], (std::vector<int>{0, 1}));
  EXPECT_EQ(placement->layers[1][3], (std::vector<int>{1, 0}));
  EXPECT_DOUBLE_EQ(r.stats().before_ratio, 1.8);
  EXPECT_LT(r.stats().after_ratio, 1.3);
}

TEST(ExpertRebalancerTest, KeepsThePlacementForABalancedLoadOrASmallGain) {
  const parallel::Partition plan = EpPlan(2, 2, 1, 1);
  ExpertRebalancer r(plan, {.interval_ns = kSecond, .min_rows = 100, .min_gain = 0.05});
  EXPECT_FALSE(r.Consider(Reports(plan, {0, 0, 0, 0}), 0));
  EXPECT_FALSE(r.Consider(Reports(plan, {250, 250, 250, 250}), 2 * kSecond));  // balanced
  // 52 / 48: copies would gain under 5%.
  EXPECT_FALSE(r.Consider(Reports(plan, {510, 510, 490, 490}), 4 * kSecond));
  EXPECT_EQ(r.stats().decisions, 2);
  EXPECT_EQ(r.stats().rebalances, 0);
}

TEST(ExpertRebalancerTest, CountersThatGoBackStartANewWindow) {
  const parallel::Partition plan = EpPlan(2, 2, 1, 1);
  ExpertRebalancer r(plan, {.interval_ns = kSecond, .min_rows = 100, .min_gain = 0.05});
  EXPECT_FALSE(r.Consider(Reports(plan, {5000, 5000, 0, 0}), 0));
  // An engine restart: the ranks count from zero again, so this is not a window.
  EXPECT_FALSE(r.Consider(Reports(plan, {90, 90, 10, 10}), 2 * kSecond));
  EXPECT_EQ(r.stats().decisions, 0);
  EXPECT_TRUE(r.Consider(Reports(plan, {180, 180, 20, 20}), 4 * kSecond));
}

}  // namespace
}  // namespace tessera::engine
