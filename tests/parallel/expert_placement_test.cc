#include "parallel/expert_placement.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessera::parallel {
namespace {

double Busiest(const ExpertPlacement& p, const std::vector<int64_t>& load, int ep) {
  const std::vector<double> rows = ExpectedRankRows(p.holders, load, ep);
  return *std::max_element(rows.begin(), rows.end());
}

TEST(ExpertPlacementTest, ContiguousIsEachExpertAtHome) {
  const ExpertPlacement p = ContiguousPlacement(8, 4);
  EXPECT_EQ(p.ToJson(), R"({"experts":[[0],[0],[1],[1],[2],[2],[3],[3]]})");
  EXPECT_EQ(p.HeldBy(2), (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(CheckExpertPlacement(p, 8, 4, 0, 3).ok());
}

TEST(ExpertPlacementTest, JsonRoundTripsAndBadFilesAreRefused) {
  const ExpertPlacement p{.holders = {{0}, {0, 1}, {1, 0}, {1}}};
  auto parsed = ParseExpertPlacement(p.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->holders, p.holders);
  for (const char* bad : {"", "[]", "{\"experts\": 3}", "{\"experts\": [[0], 1]}",
                          "{\"experts\": [[0], [\"a\"]]}", "{\"experts\": [[-1]]}", "{"}) {
    EXPECT_FALSE(ParseExpertPlacement(bad).ok()) << bad;
  }
}

TEST(ExpertPlacementTest, IntsRoundTripAndTruncatedListsAreRefused) {
  const ExpertPlacement p{.holders = {{0}, {0, 1}, {1, 0}, {1}}};
  EXPECT_EQ(p.ToInts(), (std::vector<int32_t>{0, 4, 1, 0, 2, 0, 1, 2, 1, 0, 1, 1}));
  auto back = PlacementFromInts(p.ToInts());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->holders, p.holders);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{0, 2, 1, 0, 3, 0, 1}, std::vector<int32_t>{0, 1, -1},
        std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{2, 1, 1, 0}}) {
    auto refused = PlacementFromInts(bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("holders"), std::string::npos)
        << refused.status().ToString();
  }
}

TEST(ExpertPlacementTest, BalancingCopiesTheHotExpertsOntoTheIdleRank) {
  // Experts 0 and 1 (both at home on rank 0) take most of the rows. One replica slot
  // a rank: expert 0 gets a copy on rank 1 (rank 0: 300 + 400, rank 1: 300 + 20);
  // rank 1's slot is then used, and rank 0's stays free: a copy of expert 2 there
  // would only move work onto the busiest rank (705). Two slots a rank also copy
  // expert 1.
  const std::vector<int64_t> load = {600, 400, 10, 10};
  const ExpertPlacement before = ContiguousPlacement(4, 2);
  const ExpertPlacement after = BalanceExperts(load, 2, 1);
  EXPECT_TRUE(CheckExpertPlacement(after, 4, 2, 1, 3).ok()) << after.ToJson();
  EXPECT_EQ(after.holders[0], (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(Busiest(before, load, 2), 1000);
  EXPECT_DOUBLE_EQ(Busiest(after, load, 2), 700);
  EXPECT_EQ(after.HeldBy(0), (std::vector<int32_t>{0, 1}));
  EXPECT_LT(Busiest(BalanceExperts(load, 2, 2), load, 2), Busiest(after, load, 2));
  // No redundancy: nothing moves.
  EXPECT_EQ(BalanceExperts(load, 2, 0).holders, before.holders);
  // An idle model: copies carry nothing, none are made.
  EXPECT_EQ(BalanceExperts({0, 0, 0, 0}, 2, 2).holders, before.holders);
}

TEST(ExpertPlacementTest, CheckNamesTheFault) {
  auto message = [](const ExpertPlacement& p, int redundant) {
    return CheckExpertPlacement(p, 4, 2, redundant, 2).ToString();
  };
  EXPECT_NE(message({.holders = {{0}, {0}, {1}}}, 0).find("lists 3 experts"), std::string::npos);
  EXPECT_NE(message({.holders = {{0}, {0}, {1}, {5}}}, 0).find("EP rank 5"), std::string::npos);
  EXPECT_NE(message({.holders = {{0}, {0, 1}, {1}, {1}}}, 0).find("EP rank 1 would hold 3"),
            std::string::npos);
  EXPECT_TRUE(CheckExpertPlacement({.holders = {{0}, {0, 1}, {1}, {1}}}, 4, 2, 1, 2).ok());
  // Per layer: every layer's table checked, and one table a layer.
  const ExpertHolders home = {{0}, {0}, {1}, {1}};
  EXPECT_TRUE(CheckExpertPlacement({.layers = {home, {{0}, {0, 1}, {1}, {1}}}}, 4, 2, 1, 2).ok());
  EXPECT_NE(message({.layers = {home, {{0}, {0}, {1}, {1, 0, 1}}}}, 1).find("layer 1: expert 3"),
            std::string::npos)
      << message({.layers = {home, {{0}, {0}, {1}, {1, 0, 1}}}}, 1);
  EXPECT_NE(message({.layers = {home}}, 0).find("1 layer tables; the model has 2"),
            std::string::npos);
}

// Each layer's hot experts are its own: a table per layer balances what one table
// for every layer cannot (the summed load is flat).
TEST(ExpertPlacementTest, PerLayerBalancingFollowsEachLayersHotExperts) {
  const std::vector<std::vector<int64_t>> load = {{800, 100, 50, 50}, {50, 50, 100, 800}};
  const ExpertPlacement by_layer = BalanceExpertsByLayer(load, 2, 1);
  ASSERT_TRUE(by_layer.per_layer());
  EXPECT_TRUE(CheckExpertPlacement(by_layer, 4, 2, 1, 2).ok()) << by_layer.ToJson();
  EXPECT_EQ(by_layer.layers[0][0], (std::vector<int>{0, 1}));  // layer 0's hot expert 0
  EXPECT_EQ(by_layer.layers[1][3], (std::vector<int>{1, 0}));  // layer 1's hot expert 3
  EXPECT_EQ(by_layer.HeldBy(1, 0), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(by_layer.HeldBy(0, 1), (std::vector<int32_t>{0, 1, 3}));
  // Summed over the layers every expert carries 850-900 rows: one table gains
  // nothing, the per-layer ones halve the busiest rank's excess.
  const ExpertPlacement home = ContiguousPlacement(4, 2);
  EXPECT_DOUBLE_EQ(BusiestOverMean(home, load, 2), 1800.0 / 1000);
  EXPECT_LT(BusiestOverMean(by_layer, load, 2), 1.3);
  // JSON and step-message ints round trip.
  auto parsed = ParseExpertPlacement(by_layer.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->layers, by_layer.layers);
  auto back = PlacementFromInts(by_layer.ToInts());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->layers, by_layer.layers);
  EXPECT_FALSE(ParseExpertPlacement(R"({"layers": []})").ok());
  EXPECT_FALSE(ParseExpertPlacement(R"({"layers": [[[0]]], "experts": [[0]]})").ok());
}

}  // namespace
}  // namespace tessera::parallel
