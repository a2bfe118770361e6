#include "parallel/expert_placement.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tessera::parallel {
namespace {

double Busiest(const ExpertPlacement& p, const std::vector<int64_t>& load, int ep) {
  const std::vector<double> rows = ExpectedRankRows(p, load, ep);
  return *std::max_element(rows.begin(), rows.end());
}

TEST(ExpertPlacementTest, ContiguousIsEachExpertAtHome) {
  const ExpertPlacement p = ContiguousPlacement(8, 4);
  EXPECT_EQ(p.ToJson(), R"({"experts":[[0],[0],[1],[1],[2],[2],[3],[3]]})");
  EXPECT_EQ(p.HeldBy(2), (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(CheckExpertPlacement(p, 8, 4, 0).ok());
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
  EXPECT_EQ(p.ToInts(), (std::vector<int32_t>{1, 0, 2, 0, 1, 2, 1, 0, 1, 1}));
  auto back = PlacementFromInts(p.ToInts());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->holders, p.holders);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{1, 0, 3, 0, 1}, std::vector<int32_t>{-1}, std::vector<int32_t>{2}}) {
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
  EXPECT_TRUE(CheckExpertPlacement(after, 4, 2, 1).ok()) << after.ToJson();
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
    return CheckExpertPlacement(p, 4, 2, redundant).ToString();
  };
  EXPECT_NE(message({.holders = {{0}, {0}, {1}}}, 0).find("lists 3 experts"), std::string::npos);
  EXPECT_NE(message({.holders = {{0}, {0}, {1}, {5}}}, 0).find("EP rank 5"), std::string::npos);
  EXPECT_NE(message({.holders = {{0}, {0, 1}, {1}, {1}}}, 0).find("EP rank 1 would hold 3"),
            std::string::npos);
  EXPECT_TRUE(CheckExpertPlacement({.holders = {{0}, {0, 1}, {1}, {1}}}, 4, 2, 1).ok());
}

}  // namespace
}  // namespace tessera::parallel
