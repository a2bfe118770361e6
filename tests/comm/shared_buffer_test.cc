// Shared buffers (Communicator::AllocateShared): every collective whose buffers lie
// in them, with messages above and below the descriptor threshold, against the exact
// reference of bench/pattern.h; world sizes 1-4, shared memory and TCP (where the
// buffers are plain memory). Ranks run as threads. The messenger's checks of a peer's
// shared-buffer descriptor are in security_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/bench/pattern.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

using testing::RunRanks;
using testing::TestOptions;

using Param = testing::WorldParam;

class SharedBufferTest : public ::testing::TestWithParam<Param> {};

CommOptions Options(TransportKind transport) {
  CommOptions options = TestOptions(transport);
  options.shm_shared_buffer_bytes = 4096;  // descriptors from 4 KiB, streams below
  return options;
}

// Bytes past the start of the buffer where the collectives' data begins, so
// descriptors carry an offset.
constexpr size_t kSkew = 72;
constexpr size_t kCounts[] = {0, 1, 7, 4099, 70000};

TEST_P(SharedBufferTest, EveryCollectiveInSharedBuffersMatchesTheReference) {
  const Param p = GetParam();
  RunRanks(p.ranks, Options(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    constexpr DataType dt = DataType::kF32;
    const size_t esize = DataTypeSize(dt);
    const size_t cap = kSkew + n * 70000 * esize + 64;
    auto send_buffer = comm.AllocateShared(cap);
    auto recv_buffer = comm.AllocateShared(cap);
    ASSERT_TRUE(send_buffer.ok() && recv_buffer.ok()) << send_buffer.status().ToString();
    const bool expect_shared = n > 1 && p.transport == TransportKind::kShm;
    EXPECT_EQ(send_buffer->shared(), expect_shared);
    EXPECT_GE(send_buffer->size(), cap);
    uint8_t* send = send_buffer->data() + kSkew;
    uint8_t* recv = recv_buffer->data() + kSkew;
    std::vector<uint8_t> expected(cap);
    for (size_t count : kCounts) {
      // all-reduce, every algorithm, and reduce: sum and max.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        FillExpected(expected.data(), count, dt, op, n, 0);
        for (AllReduceAlgo algo : {AllReduceAlgo::kRing, AllReduceAlgo::kRecursiveDoubling,
                                   AllReduceAlgo::kDeterministic, AllReduceAlgo::kAuto}) {
          FillPattern(send, count, dt, op, r, 0);
          std::memset(recv, 0xcd, count * esize);
          ASSERT_OK(comm.AllReduce(send, recv, count, dt, op, algo));
          EXPECT_EQ(CountMismatches(recv, expected.data(), count, dt), 0u)
              << "all_reduce " << AllReduceAlgoName(algo) << " " << count;
          ASSERT_OK(comm.AllReduce(send, send, count, dt, op, algo));  // in place
          EXPECT_EQ(CountMismatches(send, expected.data(), count, dt), 0u)
              << "in-place all_reduce " << AllReduceAlgoName(algo) << " " << count;
        }
        FillPattern(send, count, dt, op, r, 0);
        ASSERT_OK(comm.Reduce(send, recv, count, dt, op, n - 1));
        if (r == n - 1) {
          EXPECT_EQ(CountMismatches(recv, expected.data(), count, dt), 0u);
        }
        // reduce-scatter, out of place and in place.
        FillPattern(send, n * count, dt, op, r, 0);
        FillExpected(expected.data(), count, dt, op, n, r * count);
        ASSERT_OK(comm.ReduceScatter(send, recv, count, dt, op));
        EXPECT_EQ(CountMismatches(recv, expected.data(), count, dt), 0u) << "reduce_scatter";
        ASSERT_OK(comm.ReduceScatter(send, send + r * count * esize, count, dt, op));
        EXPECT_EQ(CountMismatches(send + r * count * esize, expected.data(), count, dt), 0u);
      }
      // all-gather (both algorithms, in place too), gather, scatter.
      for (int q = 0; q < n; ++q) {
        FillPattern(expected.data() + q * count * esize, count, dt, ReduceOp::kSum, q, q * count);
      }
      for (AllGatherAlgo algo : {AllGatherAlgo::kRing, AllGatherAlgo::kBruck}) {
        FillPattern(send, count, dt, ReduceOp::kSum, r, r * count);
        std::memset(recv, 0xcd, n * count * esize);
        ASSERT_OK(comm.AllGather(send, recv, count, dt, algo));
        EXPECT_EQ(CountMismatches(recv, expected.data(), n * count, dt), 0u)
            << "all_gather " << AllGatherAlgoName(algo) << " " << count;
        ASSERT_OK(comm.AllGather(recv + r * count * esize, recv, count, dt, algo));
        EXPECT_EQ(CountMismatches(recv, expected.data(), n * count, dt), 0u);
      }
      const int root = n / 2;
      FillPattern(send, count, dt, ReduceOp::kSum, r, r * count);
      std::memset(recv, 0xcd, n * count * esize);
      ASSERT_OK(comm.Gather(send, recv, count, dt, root));
      if (r == root) {
        EXPECT_EQ(CountMismatches(recv, expected.data(), n * count, dt), 0u);
      }
      if (r == root) std::memcpy(send, expected.data(), n * count * esize);
      std::memset(recv, 0xcd, count * esize);
      ASSERT_OK(comm.Scatter(send, recv, count, dt, root));
      EXPECT_EQ(CountMismatches(recv, expected.data() + r * count * esize, count, dt), 0u);
      // broadcast, both algorithms.
      for (BroadcastAlgo algo : {BroadcastAlgo::kBinomialTree, BroadcastAlgo::kPipelinedChain}) {
        if (r == root) {
          FillPattern(send, count, dt, ReduceOp::kSum, root, 0);
        } else {
          std::memset(send, 0xcd, count * esize);
        }
        FillPattern(expected.data(), count, dt, ReduceOp::kSum, root, 0);
        ASSERT_OK(comm.Broadcast(send, count, dt, root, algo));
        EXPECT_EQ(CountMismatches(send, expected.data(), count, dt), 0u) << "broadcast " << count;
      }
      // all-to-all: block q of rank r's input goes to rank q.
      auto* in = reinterpret_cast<int32_t*>(send);
      auto* out = reinterpret_cast<int32_t*>(recv);
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) in[q * count + i] = r * 1000003 + q * 1009 + int(i);
      }
      ASSERT_OK(comm.AllToAll(send, recv, count, DataType::kI32));
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[q * count + i], q * 1000003 + r * 1009 + int(i)) << count;
        }
      }
    }
    // Same-host peers read the large messages in place; nothing else does.
    if (expect_shared) {
      EXPECT_GT(comm.InPlaceSends(), 0u);
    } else {
      EXPECT_EQ(comm.InPlaceSends(), 0u);
    }
  });
}

// The bytes a collective moves are counted the same whether they went as
// descriptors or through the ring: the ledger is what the planner checks.
TEST_P(SharedBufferTest, LedgerCountsTheSameBytesAsPlainMemory) {
  const Param p = GetParam();
  RunRanks(p.ranks, Options(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const size_t count = 50000;
    auto shared_send = comm.AllocateShared(count * 4 * n);
    auto shared_recv = comm.AllocateShared(count * 4 * n);
    ASSERT_TRUE(shared_send.ok() && shared_recv.ok());
    std::vector<uint8_t> plain_send(count * 4 * n, 1), plain_recv(count * 4 * n);
    auto bytes_of = [&](uint8_t* s, uint8_t* d) {
      comm.mutable_ledger().Reset();
      EXPECT_TRUE(comm.AllGather(s, d, count, DataType::kF32).ok());
      EXPECT_TRUE(comm.AllToAll(s, d, count, DataType::kF32).ok());
      EXPECT_TRUE(comm.ReduceScatter(s, d, count, DataType::kF32, ReduceOp::kSum).ok());
      return comm.ledger().ToString();
    };
    std::fill(shared_send->data(), shared_send->data() + count * 4 * n, 1);
    const uint64_t before = comm.InPlaceSends();
    EXPECT_EQ(bytes_of(shared_send->data(), shared_recv->data()),
              bytes_of(plain_send.data(), plain_recv.data()));
    if (shared_send->shared()) {
      EXPECT_GT(comm.InPlaceSends(), before);
    }
  });
}

// Freed buffers leave the communicator working; later allocations get new ones;
// sub-communicators have their own.
TEST_P(SharedBufferTest, FreeReallocateAndSplit) {
  const Param p = GetParam();
  RunRanks(p.ranks, Options(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    for (int round = 0; round < 3; ++round) {
      auto buffer = comm.AllocateShared(size_t{1} << 20);
      ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
      auto* v = reinterpret_cast<int32_t*>(buffer->data());
      const size_t count = (size_t{1} << 20) / 4 / n;
      for (size_t i = 0; i < count; ++i) v[r * count + i] = r + round + int(i);
      ASSERT_OK(comm.AllGather(v + r * count, v, count, DataType::kI32));
      for (int q = 0; q < n; ++q) ASSERT_EQ(v[q * count + 5], q + round + 5);
    }
    std::vector<int32_t> plain(4096, r);
    ASSERT_OK(comm.AllReduce(plain.data(), plain.data(), 4096, DataType::kI32, ReduceOp::kSum));
    EXPECT_EQ(plain[100], n * (n - 1) / 2);
    auto half = comm.Split(r % 2, r);
    ASSERT_TRUE(half.ok()) << half.status().ToString();
    auto buffer = (*half)->AllocateShared(64 << 10);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    auto* v = reinterpret_cast<int32_t*>(buffer->data());
    std::fill(v, v + (16 << 10), r);
    ASSERT_OK((*half)->AllReduce(v, v, 16 << 10, DataType::kI32, ReduceOp::kSum));
    int32_t want = 0;
    for (int q = r % 2; q < n; q += 2) want += q;
    EXPECT_EQ(v[1000], want);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SharedBufferTest,
    ::testing::Values(Param{1, TransportKind::kShm}, Param{2, TransportKind::kShm},
                      Param{3, TransportKind::kShm}, Param{4, TransportKind::kShm},
                      Param{2, TransportKind::kTcp}, Param{3, TransportKind::kTcp}),
    testing::WorldParamName);

}  // namespace
}  // namespace tessera::comm
