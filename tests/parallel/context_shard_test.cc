#include "parallel/context_shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace tessera::parallel {
namespace {

TEST(ContextShardTest, SpansGoZigZagOverTheRanks) {
  const std::vector<int> cp2 = {0, 1, 1, 0, 0, 1, 1, 0, 0};
  for (size_t k = 0; k < cp2.size(); ++k) EXPECT_EQ(ContextSpanOwner(k, 2), cp2[k]) << k;
  const std::vector<int> cp3 = {0, 1, 2, 2, 1, 0, 0, 1};
  for (size_t k = 0; k < cp3.size(); ++k) EXPECT_EQ(ContextSpanOwner(k, 3), cp3[k]) << k;
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(ContextSpanOwner(k, 1), 0);
}

// A block's owner is its span's: blocks of 16 in spans of 256 (16 blocks a span).
TEST(ContextShardTest, ABlockBelongsToItsSpansRank) {
  for (int cp = 1; cp <= 4; ++cp) {
    for (int64_t block = 0; block < 200; ++block) {
      EXPECT_EQ(ContextBlockOwner(block, 16, 256, cp), ContextSpanOwner(block / 16, cp))
          << "cp " << cp << " block " << block;
    }
  }
  EXPECT_EQ(ContextBlockOwner(15, 16, 256, 2), 0);
  EXPECT_EQ(ContextBlockOwner(16, 16, 256, 2), 1);
  EXPECT_EQ(ContextBlockOwner(47, 16, 256, 2), 1);
  EXPECT_EQ(ContextBlockOwner(48, 16, 256, 2), 0);
}

// The counts are the owners' tally, for every prefix of the spans; the maximum is
// not always rank 0's (cp 2, 3 spans: rank 1 holds two).
TEST(ContextShardTest, CountsAndMaximumAreTheOwnersTally) {
  for (int cp = 1; cp <= 5; ++cp) {
    std::vector<int64_t> tally(cp, 0);
    for (int64_t n = 0; n <= 40; ++n) {
      if (n > 0) ++tally[ContextSpanOwner(n - 1, cp)];
      for (int r = 0; r < cp; ++r) {
        EXPECT_EQ(ContextSpansOnRank(n, r, cp), tally[r])
            << "cp " << cp << " n " << n << " r " << r;
      }
      EXPECT_EQ(ContextMaxSpansOnRank(n, cp), *std::max_element(tally.begin(), tally.end()))
          << "cp " << cp << " n " << n;
    }
  }
  EXPECT_EQ(ContextSpansOnRank(3, 1, 2), 2);
  EXPECT_EQ(ContextMaxSpansOnRank(3, 2), 2);
}

}  // namespace
}  // namespace tessera::parallel
