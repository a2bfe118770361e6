// The deterministic all-reduce's contract: per element, the canonical balanced
// tree over rank index (Tree(lo,hi) = Tree(lo,mid) + Tree(mid,hi)), f16/bf16
// accumulated in f32 and rounded once — bit for bit, on every rank, for every
// transport. Checked with random (non-integer) data against an independent
// scalar recursion.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "base/half.h"
#include "comm/reduce.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

// Rank r's contribution at element i (random, reproducible on every rank).
float Contribution(int r, size_t i) {
  std::mt19937 rng(static_cast<uint32_t>(r * 7919 + i * 104729 + 17));
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  return dist(rng);
}

float ScalarTree(const std::vector<float>& x, int lo, int hi) {
  if (hi - lo == 1) return x[lo];
  int mid = lo + (hi - lo) / 2;
  return ScalarTree(x, lo, mid) + ScalarTree(x, mid, hi);
}

uint16_t ToHalf(float v, DataType dtype) {
  return dtype == DataType::kF16 ? F32ToF16(v) : F32ToBf16(v);
}
float FromHalf(uint16_t v, DataType dtype) {
  return dtype == DataType::kF16 ? F16ToF32(v) : Bf16ToF32(v);
}

TEST(TreeReduceTest, MatchesScalarRecursionForEveryRankCount) {
  const size_t count = 3000;  // crosses the 1024-element block boundary
  for (int n = 1; n <= 9; ++n) {
    std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
    std::vector<const void*> ptrs(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) inputs[r][i] = Contribution(r, i);
      ptrs[r] = inputs[r].data();
    }
    std::vector<float> out(count);
    TreeReduce(ptrs, out.data(), count, DataType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      std::vector<float> x(n);
      for (int r = 0; r < n; ++r) x[r] = inputs[r][i];
      float expected = ScalarTree(x, 0, n);
      ASSERT_EQ(std::memcmp(&out[i], &expected, 4), 0) << "n " << n << " i " << i;
    }
  }
}

class DeterministicAllReduceTest : public ::testing::TestWithParam<std::tuple<int, TransportKind>> {
};

// Large: two-shot, several 256 KiB blocks per shard, uneven shards. Small (fits
// the mailbox): one-shot on shared memory, recursive doubling or two-shot on TCP.
void ExpectCanonicalTree(int n, TransportKind transport, size_t count) {
  // table[q][i]: rank q's contribution (computed once; every rank reads it).
  std::vector<std::vector<float>> table(n, std::vector<float>(count));
  for (int q = 0; q < n; ++q) {
    std::mt19937 rng(static_cast<uint32_t>(q * 7919 + 17));
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (size_t i = 0; i < count; ++i) table[q][i] = dist(rng);
  }
  auto contribution = [&](int q, size_t i) { return table[q][i]; };
  testing::RunRanks(n, testing::TestOptions(transport), [&](Communicator& comm) {
    const int r = comm.rank();
    // f32
    std::vector<float> mine(count), out(count);
    for (size_t i = 0; i < count; ++i) mine[i] = contribution(r, i);
    ASSERT_OK(comm.AllReduce(mine.data(), out.data(), count, DataType::kF32, ReduceOp::kSum,
                             AllReduceAlgo::kDeterministic));
    size_t wrong = 0;
    std::vector<float> x(n);
    for (size_t i = 0; i < count; ++i) {
      for (int q = 0; q < n; ++q) x[q] = contribution(q, i);
      float expected = ScalarTree(x, 0, n);
      if (std::memcmp(&out[i], &expected, 4) != 0) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << "f32, " << count << " elements";
    // The deterministic reduce-scatter: block r of n equal blocks gets the same
    // bits as the all-reduce's (checked above), out of place and in place.
    const size_t block = count / static_cast<size_t>(n);
    std::vector<float> rs(block), in_place = mine;
    ASSERT_OK(comm.ReduceScatter(mine.data(), rs.data(), block, DataType::kF32, ReduceOp::kSum,
                                 ReduceScatterAlgo::kDeterministic));
    ASSERT_OK(comm.ReduceScatter(in_place.data(), in_place.data() + r * block, block,
                                 DataType::kF32, ReduceOp::kSum,
                                 ReduceScatterAlgo::kDeterministic));
    EXPECT_EQ(std::memcmp(rs.data(), out.data() + r * block, block * 4), 0) << "reduce-scatter";
    EXPECT_EQ(std::memcmp(in_place.data() + r * block, out.data() + r * block, block * 4), 0)
        << "reduce-scatter in place";
    // f16 and bf16: f32 accumulation with the same tree, one rounding.
    for (DataType dtype : {DataType::kF16, DataType::kBf16}) {
      std::vector<uint16_t> h(count), hout(count);
      for (size_t i = 0; i < count; ++i) h[i] = ToHalf(contribution(r, i), dtype);
      ASSERT_OK(comm.AllReduce(h.data(), hout.data(), count, dtype, ReduceOp::kSum,
                               AllReduceAlgo::kDeterministic));
      wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        for (int q = 0; q < n; ++q) x[q] = FromHalf(ToHalf(contribution(q, i), dtype), dtype);
        uint16_t expected = ToHalf(ScalarTree(x, 0, n), dtype);
        if (hout[i] != expected) ++wrong;
      }
      EXPECT_EQ(wrong, 0u) << DataTypeName(dtype);
      std::vector<uint16_t> hrs(block);
      ASSERT_OK(comm.ReduceScatter(h.data(), hrs.data(), block, dtype, ReduceOp::kSum,
                                   ReduceScatterAlgo::kDeterministic));
      EXPECT_EQ(std::memcmp(hrs.data(), hout.data() + r * block, block * 2), 0)
          << "reduce-scatter " << DataTypeName(dtype);
    }
  });
}

TEST_P(DeterministicAllReduceTest, BitIdenticalToCanonicalTree) {
  ExpectCanonicalTree(std::get<0>(GetParam()), std::get<1>(GetParam()), 150001);
}

TEST_P(DeterministicAllReduceTest, SmallMessagesBitIdenticalToCanonicalTree) {
  ExpectCanonicalTree(std::get<0>(GetParam()), std::get<1>(GetParam()), 1001);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeterministicAllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8),
                                            ::testing::Values(TransportKind::kShm,
                                                              TransportKind::kTcp)));

TEST(LedgerTest, RingAllReduceMovesTwoNMinusOneOverNBytes) {
  for (int n : {2, 4}) {
    testing::RunRanks(n, testing::TestOptions(TransportKind::kShm), [&](Communicator& comm) {
      const size_t count = 1 << 16;  // divisible by n
      std::vector<float> v(count, 1.0f);
      comm.mutable_ledger().Reset();
      ASSERT_OK(comm.AllReduce(v.data(), v.data(), count, DataType::kF32, ReduceOp::kSum,
                               AllReduceAlgo::kRing));
      ASSERT_OK(comm.AllGather(v.data() + comm.rank() * (count / n), v.data(), count / n,
                               DataType::kF32));  // in place
      const LedgerEntry& ar = comm.ledger().entry(Primitive::kAllReduce);
      EXPECT_EQ(ar.calls, 1u);
      EXPECT_EQ(ar.bytes_sent, 2 * (n - 1) * count * 4 / n);
      EXPECT_EQ(ar.bytes_received, 2 * (n - 1) * count * 4 / n);
      const LedgerEntry& ag = comm.ledger().entry(Primitive::kAllGather);
      EXPECT_EQ(ag.calls, 1u);
      EXPECT_EQ(ag.bytes_sent, (n - 1) * (count / n) * 4);
      EXPECT_NE(comm.ledger().ToJson().find("\"all_reduce\""), std::string::npos);
    });
  }
}

TEST(LedgerTest, OneShotAllReduceReadsEveryPeersBuffer) {
  for (int n : {2, 3}) {
    testing::RunRanks(n, testing::TestOptions(TransportKind::kShm), [&](Communicator& comm) {
      const size_t count = 1000;
      std::vector<float> v(count, 1.0f);
      comm.mutable_ledger().Reset();
      EXPECT_EQ(comm.ChooseAllReduce(count * 4, AllReduceAlgo::kAuto), AllReduceAlgo::kOneShot);
      ASSERT_OK(comm.AllReduce(v.data(), v.data(), count, DataType::kF32, ReduceOp::kSum));
      EXPECT_EQ(v[0], static_cast<float>(n));
      const LedgerEntry& ar = comm.ledger().entry(Primitive::kAllReduce);
      EXPECT_EQ(ar.calls, 1u);
      EXPECT_EQ(ar.bytes_sent, (n - 1) * count * 4);
      EXPECT_EQ(ar.bytes_received, (n - 1) * count * 4);
    });
  }
}

TEST(OneShotTest, NeedsEveryRankOnSharedMemory) {
  testing::RunRanks(2, testing::TestOptions(TransportKind::kTcp), [&](Communicator& comm) {
    EXPECT_EQ(comm.ChooseAllReduce(64, AllReduceAlgo::kOneShot), AllReduceAlgo::kRecursiveDoubling);
  });
  CommOptions no_mailbox = testing::TestOptions(TransportKind::kShm);
  no_mailbox.allreduce_oneshot_bytes = 0;
  testing::RunRanks(2, no_mailbox, [&](Communicator& comm) {
    EXPECT_EQ(comm.ChooseAllReduce(64, AllReduceAlgo::kAuto), AllReduceAlgo::kRecursiveDoubling);
    EXPECT_EQ(comm.ChooseAllReduce(0, AllReduceAlgo::kOneShot), AllReduceAlgo::kRecursiveDoubling);
  });
}

// Back-to-back one-shot exchanges with ranks drifting apart (one sleeps now and
// then): a slot is never overwritten while a peer still reads it.
TEST(OneShotTest, BackToBackExchangesNeverReadAStaleSlot) {
  testing::RunRanks(3, testing::TestOptions(TransportKind::kShm), [&](Communicator& comm) {
    const size_t count = 257;
    std::vector<int32_t> v(count);
    for (int it = 0; it < 3000; ++it) {
      for (size_t i = 0; i < count; ++i) v[i] = it * 10 + comm.rank() + static_cast<int>(i);
      if (it % 97 == comm.rank()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      ASSERT_OK(comm.AllReduce(v.data(), v.data(), count, DataType::kI32, ReduceOp::kSum,
                               AllReduceAlgo::kOneShot));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(v[i], 3 * (it * 10 + static_cast<int>(i)) + 3) << "iteration " << it;
      }
    }
  });
}

}  // namespace
}  // namespace tessera::comm
