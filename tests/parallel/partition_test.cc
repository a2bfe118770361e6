// Partition: rank mapping, stage balancing by bytes, --pp-layers parsing.
#include "parallel/partition.h"

#include <gtest/gtest.h>

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
