// Partition: rank mapping (tp, cp, pp), stage balancing by bytes, --pp-layers parsing.
#include "parallel/partition.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::parallel {
namespace {

TEST(ParallelPlanTest, RankOrderIsTpInnermost) {
  auto plan = MakePartition({.tp = 2, .pp = 3}, std::vector<int64_t>(6, 10), 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->world_size(), 6);
  EXPECT_EQ(plan->StageOf(3), 1);
  EXPECT_EQ(plan->TpRankOf(3), 1);
  EXPECT_EQ(plan->RankOf(2, 1), 5);
  EXPECT_EQ(plan->driver_rank(), 4);
}

TEST(ParallelPlanTest, EqualLayersSplitEvenly) {
  auto plan = MakePartition({.pp = 4}, std::vector<int64_t>(22, 100), 0);
  ASSERT_TRUE(plan.ok());
  int64_t total = 0;
  for (const LayerRange& r : plan->stage_layers) {
    EXPECT_GE(r.size(), 5);
    EXPECT_LE(r.size(), 6);
    total += r.size();
  }
  EXPECT_EQ(total, 22);
  EXPECT_EQ(plan->stage_layers.front().begin, 0);
  EXPECT_EQ(plan->stage_layers.back().end, 22);
}

TEST(ParallelPlanTest, TheHeadWeighsOnTheLastStage) {
  // 10 layers of 100 bytes and a 400-byte head: the last stage gets fewer layers.
  auto plan = MakePartition({.pp = 2}, std::vector<int64_t>(10, 100), 400);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stage_layers[0].size(), 7);
  EXPECT_EQ(plan->stage_bytes[0], 700);
  EXPECT_EQ(plan->stage_bytes[1], 300 + 400);
}

TEST(ParallelPlanTest, UnevenLayersMinimiseTheLargestStage) {
  auto plan = MakePartition({.pp = 3}, {50, 50, 50, 300, 50, 50, 50}, 0);
  ASSERT_TRUE(plan.ok());
  int64_t largest = 0;
  for (int64_t b : plan->stage_bytes) largest = std::max(largest, b);
  EXPECT_EQ(largest, 300);  // the big layer alone (or with nothing heavier)
}

TEST(ParallelPlanTest, ExplicitStageLayers) {
  auto plan = MakePartition({.pp = 3, .pp_layers = "0-1,2-2,3-5"}, std::vector<int64_t>(6, 1), 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->stage_layers[1].begin, 2);
  EXPECT_EQ(plan->stage_layers[1].end, 3);
  EXPECT_EQ(plan->ToString(), "tp1 pp3, stages 0-1 | 2-2 | 3-5");
}

// Context parallelism: rank = (stage × cp + cp_rank) × tp + tp_rank — tp innermost,
// then cp, stages outermost; a stage's cp × tp ranks are its lanes.
TEST(ParallelPlanTest, ContextParallelRankOrder) {
  auto plan = MakePartition({.tp = 2, .pp = 2, .cp = 2}, std::vector<int64_t>(4, 10), 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->cp, 2);
  EXPECT_EQ(plan->world_size(), 8);
  EXPECT_EQ(plan->lanes(), 4);
  for (int rank = 0; rank < 8; ++rank) {
    const int stage = rank / 4, cp_rank = rank / 2 % 2, tp_rank = rank % 2;
    EXPECT_EQ(plan->StageOf(rank), stage) << "rank " << rank;
    EXPECT_EQ(plan->CpRankOf(rank), cp_rank) << "rank " << rank;
    EXPECT_EQ(plan->TpRankOf(rank), tp_rank) << "rank " << rank;
    EXPECT_EQ(plan->LaneOf(rank), cp_rank * 2 + tp_rank) << "rank " << rank;
    EXPECT_EQ(plan->RankOf(stage, tp_rank, cp_rank), rank);
    EXPECT_EQ(plan->RankOf(stage, plan->LaneOf(rank)), rank);
  }
  EXPECT_EQ(plan->StageOf(6), 1);
  EXPECT_EQ(plan->CpRankOf(6), 1);
  EXPECT_EQ(plan->TpRankOf(6), 0);
  EXPECT_EQ(plan->RankOf(1, 1, 0), 5);
  EXPECT_EQ(plan->RankOf(0, 0, 1), 2);
  EXPECT_EQ(plan->driver_rank(), 4);  // the last stage's lane 0
  EXPECT_EQ(plan->ToString(), "tp2 cp2 pp2, stages 0-1 | 2-3");

  auto alone = MakePartition({.cp = 3}, std::vector<int64_t>(4, 10), 0);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->world_size(), 3);
  EXPECT_EQ(alone->CpRankOf(2), 2);
  EXPECT_EQ(alone->TpRankOf(2), 0);
  EXPECT_EQ(alone->StageOf(2), 0);
  EXPECT_EQ(alone->driver_rank(), 0);
  EXPECT_EQ(alone->ToString(), "tp1 cp3 pp1");
}

TEST(ParallelPlanTest, BadContextParallelRequestsAreRefused) {
  const std::vector<int64_t> layers(4, 1);
  auto refused = [&](const PartitionRequest& r, const std::string& needle) {
    auto plan = MakePartition(r, layers, 0);
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().ToString();
  };
  refused({.cp = 0}, "--cp must be at least 1");
  refused({.cp = -2}, "cp -2");
  refused({.tp = 2, .cp = 2, .ep = 2}, "--cp is not supported with --ep");
  refused({.tp = 2, .cp = 2, .sp = true}, "--cp is not supported with --sp");
  refused({.tp = 4, .pp = 2, .cp = 2, .ep = 2}, "--cp is not supported with --ep");
}

TEST(ParallelPlanTest, BadRequestsAreRefused) {
  const std::vector<int64_t> layers(4, 1);
  for (const PartitionRequest& r :
       {PartitionRequest{.tp = 0}, PartitionRequest{.pp = 0}, PartitionRequest{.pp = 5},
        PartitionRequest{.pp = 2, .pp_layers = "0-1"},
        PartitionRequest{.pp = 2, .pp_layers = "0-1,1-3"},
        PartitionRequest{.pp = 2, .pp_layers = "0-1,2-2"},
        PartitionRequest{.pp = 2, .pp_layers = "0-1,,2-3"},
        PartitionRequest{.pp = 2, .pp_layers = "1-1,2-3"},
        PartitionRequest{.pp = 2, .pp_layers = "0-1,3-2"}}) {
    auto plan = MakePartition(r, layers, 0);
    EXPECT_FALSE(plan.ok()) << "tp " << r.tp << " pp " << r.pp << " '" << r.pp_layers << "'";
  }
}

}  // namespace
}  // namespace tessera::parallel
