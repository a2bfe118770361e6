#include "plan/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace tessera::plan {
namespace {

// The ring all-reduce run literally, chunk by chunk, as collectives.h describes it:
// a reference for the closed forms.
std::vector<RankBytes> SimulateRing(int64_t count, int64_t elem_bytes, int64_t p) {
  std::vector<RankBytes> bytes(p);
  auto chunk = [&](int64_t i) { return ChunkElems(count, p, ((i % p) + p) % p); };
  for (int64_t phase = 0; phase < 2; ++phase) {
    for (int64_t s = 0; s < p - 1; ++s) {
      for (int64_t r = 0; r < p; ++r) {
        const int64_t sent_chunk = phase == 0 ? r - s : r + 1 - s;
        const int64_t n = chunk(sent_chunk) * elem_bytes;
        bytes[r].sent += n;
        bytes[(r + 1) % p].received += n;
      }
    }
  }
  return bytes;
}

TEST(ChunkElemsTest, FirstRemainderChunksAreOneLonger) {
  EXPECT_EQ(ChunkElems(7, 3, 0), 3);
  EXPECT_EQ(ChunkElems(7, 3, 1), 2);
  EXPECT_EQ(ChunkElems(7, 3, 2), 2);
  EXPECT_EQ(ChunkElems(2, 4, 1), 1);
  EXPECT_EQ(ChunkElems(2, 4, 2), 0);
  for (int64_t count : {0, 1, 7, 100, 4099}) {
    for (int64_t p = 1; p <= 8; ++p) {
      int64_t sum = 0;
      for (int64_t i = 0; i < p; ++i) sum += ChunkElems(count, p, i);
      EXPECT_EQ(sum, count) << count << " over " << p;
    }
  }
}

TEST(RingAllReduceTest, HandComputedRemainders) {
  // 7 f32 over 3 ranks: chunks 3,2,2. Rank r sends all chunks but r+1, then all but r+2.
  EXPECT_EQ(RingAllReduceBytes(7, 4, 3, 0), (RankBytes{(14 - 2 - 2) * 4, (14 - 3 - 2) * 4}));
  EXPECT_EQ(RingAllReduceBytes(7, 4, 3, 1), (RankBytes{(14 - 2 - 3) * 4, (14 - 2 - 2) * 4}));
  EXPECT_EQ(RingAllReduceBytes(7, 4, 3, 2), (RankBytes{(14 - 3 - 2) * 4, (14 - 2 - 3) * 4}));
  // Divisible: 2(P-1)/P·M per rank. 4096 f32 over 4 ranks: 2·3/4·16 KiB = 24 KiB.
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(RingAllReduceBytes(4096, 4, 4, r), (RankBytes{24576, 24576}));
  }
  EXPECT_EQ(RingAllReduceBytes(4096, 4, 1, 0), (RankBytes{0, 0}));
  EXPECT_EQ(RingAllReduceBytes(0, 4, 5, 3), (RankBytes{0, 0}));
  // 1 element over 4 ranks: only chunk 0 is non-empty. Rank 0 sends it in both
  // phases; rank 3 only in the all-gather (its reduce-scatter sends chunks 3, 2, 1).
  EXPECT_EQ(RingAllReduceBytes(1, 4, 4, 3).sent, (2 - 1 - 0) * 4);
  EXPECT_EQ(RingAllReduceBytes(1, 4, 4, 0).sent, (2 - 0 - 0) * 4);
}

TEST(RingAllReduceTest, ClosedFormMatchesChunkByChunkSimulation) {
  for (int64_t p = 1; p <= 8; ++p) {
    for (int64_t count : {0, 1, 2, 7, 100, 4099, 1 << 20}) {
      const std::vector<RankBytes> sim = SimulateRing(count, 2, p);
      int64_t total_sent = 0;
      for (int64_t r = 0; r < p; ++r) {
        EXPECT_EQ(RingAllReduceBytes(count, 2, p, r), sim[r])
            << "P=" << p << " count=" << count << " rank=" << r;
        total_sent += sim[r].sent;
      }
      EXPECT_EQ(total_sent, 2 * (p - 1) * count * 2);
    }
  }
}

TEST(RingReduceScatterTest, IsTheFirstHalf) {
  EXPECT_EQ(RingReduceScatterBytes(7, 1, 3, 0), (RankBytes{7 - 2, 7 - 3}));
  EXPECT_EQ(RingReduceScatterBytes(8, 1, 4, 2), (RankBytes{6, 6}));
}

TEST(TwoShotAllReduceTest, OwnerChunkAccounting) {
  // Rank r: count − c[r] to the owners + (P−1)·c[r] of its reduced chunk.
  EXPECT_EQ(TwoShotAllReduceBytes(7, 1, 3, 0), (RankBytes{4 + 6, 4 + 6}));
  EXPECT_EQ(TwoShotAllReduceBytes(7, 1, 3, 2), (RankBytes{5 + 4, 5 + 4}));
  // Totals equal the ring's: 2(P−1)·count over all ranks.
  for (int64_t p = 2; p <= 8; ++p) {
    int64_t total = 0;
    for (int64_t r = 0; r < p; ++r) total += TwoShotAllReduceBytes(4099, 4, p, r).sent;
    EXPECT_EQ(total, 2 * (p - 1) * 4099 * 4) << p;
  }
}

TEST(RecursiveDoublingTest, PowerOfTwoAndFoldedExtras) {
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 4, 1), (RankBytes{800, 800}));  // 2 rounds
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 8, 5), (RankBytes{1200, 1200}));
  // P = 5: P' = 4; rank 4 folds into rank 0 (comm's convention: r >= P' → r − P'):
  // one send, one receive.
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 5, 4), (RankBytes{400, 400}));
  // Rank 0 receives rank 4's buffer, does 2 rounds, sends the result back: 3 each.
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 5, 0), (RankBytes{1200, 1200}));
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 5, 1), (RankBytes{800, 800}));
  // P = 6: ranks 4, 5 fold into 0, 1.
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 6, 1), (RankBytes{1200, 1200}));
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 6, 2), (RankBytes{800, 800}));
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 6, 5), (RankBytes{400, 400}));
  EXPECT_EQ(RecursiveDoublingAllReduceBytes(100, 4, 1, 0), (RankBytes{0, 0}));
}

TEST(AllGatherTest, RingSendsAllButTheNextRanksBlock) {
  const std::vector<int64_t> blocks = {3, 2, 2};
  EXPECT_EQ(RingAllGatherBytes(blocks, 4, 0), (RankBytes{(7 - 2) * 4, (7 - 3) * 4}));
  EXPECT_EQ(RingAllGatherBytes(blocks, 4, 2), (RankBytes{(7 - 3) * 4, (7 - 2) * 4}));
  const std::vector<int64_t> one = {5};
  EXPECT_EQ(RingAllGatherBytes(one, 4, 0), (RankBytes{0, 0}));
  // Equal blocks (comm's AllGather): ring and Bruck both move (P−1) blocks.
  EXPECT_EQ(AllGatherBytes(1000, 5), (RankBytes{4000, 4000}));
  EXPECT_EQ(AllGatherBytes(1000, 1), (RankBytes{0, 0}));
}

// Direct gather: each non-root sends its block once; the root receives P−1 blocks
// (its own is a copy).
TEST(GatherTest, RootReceivesTheOthersBlocks) {
  EXPECT_EQ(GatherBytes(1000, 4, 0, 0), (RankBytes{0, 3000}));
  EXPECT_EQ(GatherBytes(1000, 4, 2, 0), (RankBytes{1000, 0}));
  EXPECT_EQ(GatherBytes(1000, 4, 3, 3), (RankBytes{0, 3000}));
  EXPECT_EQ(GatherBytes(1000, 1, 0, 0), (RankBytes{0, 0}));
}

// Bruck's steps carry min(d, P−d) blocks for d = 1, 2, 4, … < P: P−1 in all.
TEST(AllGatherTest, BruckStepsSumToPMinusOneBlocks) {
  for (int64_t p = 2; p <= 16; ++p) {
    int64_t blocks = 0;
    for (int64_t d = 1; d < p; d *= 2) blocks += std::min(d, p - d);
    EXPECT_EQ(blocks, p - 1) << p;
  }
}

TEST(AllToAllTest, DiagonalIsNotTraffic) {
  const std::vector<int64_t> send = {1, 2, 3};
  const std::vector<int64_t> recv = {4, 5, 6};
  EXPECT_EQ(AllToAllvBytes(send, recv, 2, 1), (RankBytes{(1 + 3) * 2, (4 + 6) * 2}));
}

TEST(AlphaBetaTest, StepCountsAndSelection) {
  const Link link{"l", 1.0, 10.0};  // 1 GB/s, 10 us
  // Ring, 4 ranks, 4000 B: 6 steps of (10 us + 1000 B / 1 GB/s = 1 us).
  EXPECT_NEAR(AllReduceSeconds(AllReduceAlgo::kRing, 1000, 4, 4, link), 6 * 11e-6, 1e-12);
  // Recursive doubling, 4 ranks: 2 steps of (10 us + 4 us).
  EXPECT_NEAR(AllReduceSeconds(AllReduceAlgo::kRecursiveDoubling, 1000, 4, 4, link), 2 * 14e-6,
              1e-12);
  // 5 ranks: log2 4 + 2 = 4 steps.
  EXPECT_NEAR(AllReduceSeconds(AllReduceAlgo::kRecursiveDoubling, 1000, 4, 5, link), 4 * 14e-6,
              1e-12);
  // Two-shot: one round (chunk 1000 B < 256 KiB) + the all-gather: 2 alphas, and
  // (P−1) chunks through the link twice.
  EXPECT_NEAR(AllReduceSeconds(AllReduceAlgo::kTwoShot, 1000, 4, 4, link), 2 * 10e-6 + 2 * 3e-6,
              1e-12);
  EXPECT_EQ(AllReduceSeconds(AllReduceAlgo::kRing, 1000, 4, 1, link), 0);
  EXPECT_NEAR(AllGatherSeconds(AllGatherAlgo::kRing, 2000, 3, link), 2 * 12e-6, 1e-12);
  // Bruck, 5 ranks: steps of 1, 2, 1 blocks.
  EXPECT_NEAR(AllGatherSeconds(AllGatherAlgo::kBruck, 1000, 5, link), 3 * 10e-6 + 4e-6, 1e-12);
  // Gather: the root's link carries the P−1 blocks after one alpha.
  EXPECT_NEAR(GatherSeconds(1000, 4, link), 10e-6 + 3e-6, 1e-12);
  EXPECT_EQ(GatherSeconds(1000, 1, link), 0);
  EXPECT_NEAR(AllToAllSeconds(3000, 4, link), 10e-6 + 3e-6, 1e-12);
  EXPECT_NEAR(SendRecvSeconds(1e6, link), 10e-6 + 1e-3, 1e-12);
}

TEST(LibraryChoiceTest, MirrorsCommsThresholds) {
  const AllReduceThresholds one_host;  // comm's defaults
  const AllReduceThresholds two_hosts{.small_bytes = 32 << 10, .oneshot_bytes = 0};
  EXPECT_EQ(LibraryAllReduceChoice(32 << 10, one_host), AllReduceAlgo::kOneShot);
  EXPECT_EQ(LibraryAllReduceChoice(32 << 10, two_hosts), AllReduceAlgo::kRecursiveDoubling);
  EXPECT_EQ(LibraryAllReduceChoice(0, two_hosts), AllReduceAlgo::kRecursiveDoubling);
  EXPECT_EQ(LibraryAllReduceChoice((32 << 10) + 1, one_host), AllReduceAlgo::kRing);
  EXPECT_EQ(LibraryAllReduceChoice((32 << 10) + 1, two_hosts), AllReduceAlgo::kRing);
  EXPECT_EQ(LibraryAllGatherChoice(16 << 10, 3, 16 << 10), AllGatherAlgo::kBruck);
  EXPECT_EQ(LibraryAllGatherChoice(16 << 10, 2, 16 << 10), AllGatherAlgo::kRing);
  EXPECT_EQ(LibraryAllGatherChoice((16 << 10) + 1, 8, 16 << 10), AllGatherAlgo::kRing);
}

TEST(AlgoNameTest, ParsesKnownNames) {
  EXPECT_EQ(*ParseAllReduceAlgo("ring"), AllReduceAlgo::kRing);
  EXPECT_EQ(*ParseAllReduceAlgo("rd"), AllReduceAlgo::kRecursiveDoubling);
  EXPECT_EQ(*ParseAllReduceAlgo("one-shot"), AllReduceAlgo::kOneShot);
  EXPECT_EQ(*ParseAllReduceAlgo("two-shot"), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(*ParseAllReduceAlgo("deterministic"), AllReduceAlgo::kDeterministic);
  const AllReduceThresholds one_host;
  const AllReduceThresholds two_hosts{.small_bytes = 32 << 10, .oneshot_bytes = 0};
  EXPECT_EQ(DeterministicAllReduceChoice(64, one_host, 3), AllReduceAlgo::kOneShot);
  EXPECT_EQ(DeterministicAllReduceChoice(32 << 10, two_hosts, 4),
            AllReduceAlgo::kRecursiveDoubling);
  EXPECT_EQ(DeterministicAllReduceChoice((32 << 10) + 4, one_host, 4), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(DeterministicAllReduceChoice(64, two_hosts, 3), AllReduceAlgo::kTwoShot);
  // One-shot: every rank reads the P−1 other buffers.
  EXPECT_EQ(AllReduceBytes(AllReduceAlgo::kOneShot, 10, 4, 3, 1), (RankBytes{80, 80}));
  EXPECT_FALSE(ParseAllReduceAlgo("butterfly").ok());
}

}  // namespace
}  // namespace tessera::plan
