#include "plan/recommend.h"

#include <gtest/gtest.h>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

Estimate Fake(Parallelism p, double e2e, double throughput) {
  Estimate e;
  e.layout.decode = p;
  e.e2e_seconds = e2e;
  e.throughput_tokens_per_s = throughput;
  return e;
}

TEST(RankTest, EachGoalHasItsOrder) {
  const std::vector<Estimate> base = {
      Fake({.tp = 8}, 1.0, 100),            // fastest, with tp4 dp2
      Fake({.dp = 8}, 3.0, 900),            // most throughput
      Fake({.tp = 2}, 2.0, 300),            // fewest devices
      Fake({.tp = 4, .dp = 2}, 1.0, 200)};  // ties tp8 on latency, more throughput
  std::vector<Estimate> v = base;
  RankEstimates(Goal::kLatency, v);
  // Same latency and devices: throughput decides.
  EXPECT_EQ(v[0].layout.ToString(), "tp4 dp2");
  EXPECT_EQ(v[1].layout.ToString(), "tp8");
  EXPECT_EQ(v[3].layout.ToString(), "dp8");
  v = base;
  RankEstimates(Goal::kThroughput, v);
  EXPECT_EQ(v[0].layout.ToString(), "dp8");
  v = base;
  RankEstimates(Goal::kDevices, v);
  EXPECT_EQ(v[0].layout.ToString(), "tp2");
  // An overloaded layout goes last whatever its figures.
  v = base;
  v[1].overloaded = true;
  RankEstimates(Goal::kThroughput, v);
  EXPECT_EQ(v[3].layout.ToString(), "dp8");
}

TEST(RankTest, LatencyTiesPreferHigherThroughput) {
  std::vector<Estimate> v = {Fake({.tp = 2}, 1.0, 100), Fake({.tp = 2, .cp = 1}, 1.0, 300)};
  v[1].layout.decode.dp = 1;
  RankEstimates(Goal::kLatency, v);
  EXPECT_EQ(v[0].throughput_tokens_per_s, 300);
}

TEST(PlanTest, Llama70bOnOneNodeFollowsTheGuide) {
  Workload w;
  w.weight_dtype = *ParseDType("bf16");
  w.act_dtype = *ParseDType("bf16");
  w.concurrency = 16;
  Result<Plan> plan =
      MakePlan(*ModelPreset("llama-3-70b"), *ClusterPreset("8xh100"), w, Goal::kLatency, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_GT(plan->rejected, 0);  // tp1, tp2 cannot hold 141 GB
  EXPECT_EQ(plan->ranked.front().layout.decode, (Parallelism{.tp = 8}));
  EXPECT_NE(plan->explanation.find("TP over the fast link"), std::string::npos)
      << plan->explanation;
  EXPECT_NE(plan->explanation.find("follows it"), std::string::npos) << plan->explanation;
  for (size_t i = 1; i < plan->ranked.size(); ++i) {
    EXPECT_LE(plan->ranked[i - 1].e2e_seconds, plan->ranked[i].e2e_seconds);
  }
}

TEST(PlanTest, DesktopsOnSlowNetworkPreferDataParallel) {
  // A 1.1B model on four desktops over 1 GbE: the guide says "fits one device →
  // DP" for throughput and "one device" for latency.
  Workload w;
  w.weight_dtype = *ParseDType("bf16");
  w.concurrency = 4;
  Result<Plan> plan = MakePlan(*ModelPreset("tinyllama-1.1b"), *ClusterPreset("4xdesktop-1gbe"), w,
                               Goal::kThroughput, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->ranked.front().layout.decode, (Parallelism{.dp = 4}));
  EXPECT_NE(plan->explanation.find("DP, no communication"), std::string::npos);
  const GuideAdvice tp4 =
      SeedGuide(*ModelPreset("tinyllama-1.1b"), *ClusterPreset("4xdesktop-1gbe"), w,
                Goal::kThroughput, {{.tp = 4}, std::nullopt});
  EXPECT_FALSE(tp4.follows);
}

TEST(PlanTest, NothingFitsIsResourceExhausted) {
  Workload w;
  w.weight_dtype = *ParseDType("bf16");
  Result<Plan> plan = MakePlan(*ModelPreset("llama-3-405b"), *ClusterPreset("4xdesktop-1gbe"), w,
                               Goal::kLatency, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("no layout of 'llama-3-405b' fits"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("does not fit"), std::string::npos);
}

TEST(PlanTest, GoalNames) {
  EXPECT_EQ(*ParseGoal("throughput"), Goal::kThroughput);
  EXPECT_EQ(*ParseGoal("devices"), Goal::kDevices);
  EXPECT_EQ(ParseGoal("cheapest").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::plan
