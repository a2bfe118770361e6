// The collective matrix: every collective × dtype × op × algorithm × world size
// {1,2,3,4,5,8} × transport {shm, tcp} × counts {0, 1, 7, 4099} (plus ~1M for
// the bandwidth paths) against the exact reference of bench/pattern.h, and on
// the MPI transport (where built) world sizes {2,3,5}. Ranks run as threads (over
// MPI: of one singleton MPI process, each rank its own tagged streams).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "comm/bench/pattern.h"
#include "comm/reduce.h"
#include "comm/transport/mpi_channel.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

using testing::RunRanks;
using testing::TestOptions;

constexpr size_t kCounts[] = {0, 1, 7, 4099};

using Param = testing::WorldParam;

class CollectivesTest : public ::testing::TestWithParam<Param> {};

std::vector<uint8_t> Pattern(size_t count, DataType dtype, ReduceOp op, int rank,
                             size_t first = 0) {
  std::vector<uint8_t> buf(count * DataTypeSize(dtype) + 1);
  FillPattern(buf.data(), count, dtype, op, rank, first);
  return buf;
}

std::vector<uint8_t> Expected(size_t count, DataType dtype, ReduceOp op, int n, size_t first = 0) {
  std::vector<uint8_t> buf(count * DataTypeSize(dtype) + 1);
  FillExpected(buf.data(), count, dtype, op, n, first);
  return buf;
}

TEST_P(CollectivesTest, AllReduceEveryAlgoDtypeOpCount) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    int variant = 0;
    for (AllReduceAlgo algo : {AllReduceAlgo::kRing, AllReduceAlgo::kRecursiveDoubling,
                               AllReduceAlgo::kOneShot, AllReduceAlgo::kDeterministic}) {
      for (DataType dtype : kAllDataTypes) {
        for (ReduceOp op : kAllReduceOps) {
          for (size_t count : kCounts) {
            const bool in_place = (variant++ % 2) == 0;
            auto send = Pattern(count, dtype, op, comm.rank());
            std::vector<uint8_t> recv(send.size(), 0xcd);
            void* out = in_place ? send.data() : recv.data();
            Status s = comm.AllReduce(send.data(), out, count, dtype, op, algo);
            ASSERT_TRUE(s.ok()) << s.ToString();
            auto expected = Expected(count, dtype, op, n);
            EXPECT_EQ(CountMismatches(out, expected.data(), count, dtype), 0u)
                << AllReduceAlgoName(algo) << " " << DataTypeName(dtype) << " " << ReduceOpName(op)
                << " count " << count << (in_place ? " in place" : "");
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, AllReduceLargeCounts) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const size_t count = (size_t{1} << 20) + 3;
    for (AllReduceAlgo algo :
         {AllReduceAlgo::kRing, AllReduceAlgo::kRecursiveDoubling, AllReduceAlgo::kDeterministic}) {
      for (DataType dtype : {DataType::kF32, DataType::kBf16}) {
        auto send = Pattern(count, dtype, ReduceOp::kSum, comm.rank());
        std::vector<uint8_t> recv(send.size());
        ASSERT_OK(comm.AllReduce(send.data(), recv.data(), count, dtype, ReduceOp::kSum, algo));
        auto expected = Expected(count, dtype, ReduceOp::kSum, comm.size());
        EXPECT_EQ(CountMismatches(recv.data(), expected.data(), count, dtype), 0u)
            << AllReduceAlgoName(algo);
      }
    }
  });
}

TEST_P(CollectivesTest, ReduceAndBroadcast) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    for (int root : {0, n - 1}) {
      for (DataType dtype : kAllDataTypes) {
        for (ReduceOp op : kAllReduceOps) {
          for (size_t count : kCounts) {
            auto send = Pattern(count, dtype, op, comm.rank());
            std::vector<uint8_t> recv(send.size(), 0xcd);
            Status s = comm.Reduce(send.data(), comm.rank() == root ? recv.data() : nullptr, count,
                                   dtype, op, root);
            ASSERT_TRUE(s.ok()) << s.ToString();
            if (comm.rank() == root) {
              auto expected = Expected(count, dtype, op, n);
              EXPECT_EQ(CountMismatches(recv.data(), expected.data(), count, dtype), 0u)
                  << "reduce root " << root << " " << DataTypeName(dtype) << " " << ReduceOpName(op)
                  << " " << count;
            }
          }
        }
      }
      for (BroadcastAlgo algo : {BroadcastAlgo::kBinomialTree, BroadcastAlgo::kPipelinedChain}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{300000}}) {
          auto buf = comm.rank() == root ? Pattern(count, DataType::kI32, ReduceOp::kSum, root)
                                         : std::vector<uint8_t>(count * 4 + 1, 0);
          ASSERT_OK(comm.Broadcast(buf.data(), count, DataType::kI32, root, algo));
          auto expected = Pattern(count, DataType::kI32, ReduceOp::kSum, root);
          EXPECT_EQ(CountMismatches(buf.data(), expected.data(), count, DataType::kI32), 0u)
              << "broadcast " << BroadcastAlgoName(algo) << " root " << root << " " << count;
        }
      }
    }
  });
}

TEST_P(CollectivesTest, AllGatherGatherScatter) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    for (DataType dtype : {DataType::kF32, DataType::kF16, DataType::kU8, DataType::kI64}) {
      const size_t esize = DataTypeSize(dtype);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{70000}}) {
        // Block p of the result = rank p's pattern at offset p*count.
        std::vector<uint8_t> expected(n * count * esize + 1);
        for (int q = 0; q < n; ++q) {
          FillPattern(expected.data() + q * count * esize, count, dtype, ReduceOp::kSum, q,
                      q * count);
        }
        for (AllGatherAlgo algo : {AllGatherAlgo::kRing, AllGatherAlgo::kBruck}) {
          for (bool in_place : {false, true}) {
            std::vector<uint8_t> recv(n * count * esize + 1, 0xcd);
            std::vector<uint8_t> send = Pattern(count, dtype, ReduceOp::kSum, r, r * count);
            const void* src = send.data();
            if (in_place) {
              std::memcpy(recv.data() + r * count * esize, send.data(), count * esize);
              src = recv.data() + r * count * esize;
            }
            ASSERT_OK(comm.AllGather(src, recv.data(), count, dtype, algo));
            EXPECT_EQ(CountMismatches(recv.data(), expected.data(), n * count, dtype), 0u)
                << "all_gather " << AllGatherAlgoName(algo) << " " << count;
          }
        }
        for (int root : {0, n / 2}) {
          std::vector<uint8_t> recv(n * count * esize + 1, 0xcd);
          std::vector<uint8_t> send = Pattern(count, dtype, ReduceOp::kSum, r, r * count);
          ASSERT_OK(
              comm.Gather(send.data(), r == root ? recv.data() : nullptr, count, dtype, root));
          if (r == root) {
            EXPECT_EQ(CountMismatches(recv.data(), expected.data(), n * count, dtype), 0u);
          }
          std::vector<uint8_t> part(count * esize + 1, 0xcd);
          ASSERT_OK(
              comm.Scatter(r == root ? expected.data() : nullptr, part.data(), count, dtype, root));
          EXPECT_EQ(CountMismatches(part.data(), expected.data() + r * count * esize, count, dtype),
                    0u);
        }
      }
    }
  });
}

TEST_P(CollectivesTest, ReduceScatterEveryDtypeOp) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    for (ReduceScatterAlgo algo : {ReduceScatterAlgo::kRing, ReduceScatterAlgo::kDeterministic}) {
      for (DataType dtype : kAllDataTypes) {
        const size_t esize = DataTypeSize(dtype);
        for (ReduceOp op : kAllReduceOps) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
            const std::string what = std::string(ReduceScatterAlgoName(algo)) + " " +
                                     std::string(DataTypeName(dtype)) + " " +
                                     std::string(ReduceOpName(op)) + " " + std::to_string(count);
            auto send = Pattern(n * count, dtype, op, r);
            std::vector<uint8_t> recv(count * esize + 1, 0xcd);
            ASSERT_OK(comm.ReduceScatter(send.data(), recv.data(), count, dtype, op, algo));
            auto expected = Expected(count, dtype, op, n, r * count);
            EXPECT_EQ(CountMismatches(recv.data(), expected.data(), count, dtype), 0u) << what;
            EXPECT_EQ(recv[count * esize], 0xcd) << what << ": wrote past the block";
            // In place: the result lands in block r of the input.
            ASSERT_OK(comm.ReduceScatter(send.data(), send.data() + r * count * esize, count, dtype,
                                         op, algo));
            EXPECT_EQ(
                CountMismatches(send.data() + r * count * esize, expected.data(), count, dtype), 0u)
                << what << " in place";
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, AllToAllAndAllToAllv) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    auto value = [](int from, int to, size_t i) {
      return static_cast<int32_t>(from * 1000003 + to * 1009 + static_cast<int>(i));
    };
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      std::vector<int32_t> send(n * count), recv(n * count, -1);
      for (int to = 0; to < n; ++to) {
        for (size_t i = 0; i < count; ++i) send[to * count + i] = value(r, to, i);
      }
      ASSERT_OK(comm.AllToAll(send.data(), recv.data(), count, DataType::kI32));
      for (int from = 0; from < n; ++from) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv[from * count + i], value(from, r, i)) << "from " << from << " i " << i;
        }
      }
    }
    // all-to-allv: rank a sends (a + 2b) % 5 * 37 elements to rank b.
    auto count_of = [](int a, int b) { return static_cast<size_t>(((a + 2 * b) % 5) * 37); };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t stotal = 0, rtotal = 0;
    for (int q = 0; q < n; ++q) {
      sc[q] = count_of(r, q);
      sd[q] = stotal;
      stotal += sc[q] + 3;  // gaps between blocks
      rc[q] = count_of(q, r);
      rd[q] = rtotal;
      rtotal += rc[q] + 1;
    }
    std::vector<int32_t> send(stotal + 1), recv(rtotal + 1, -1);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < sc[q]; ++i) send[sd[q] + i] = value(r, q, i);
    }
    ASSERT_OK(comm.AllToAllv(send.data(), sc, sd, recv.data(), rc, rd, DataType::kI32));
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < rc[q]; ++i) ASSERT_EQ(recv[rd[q] + i], value(q, r, i));
    }
  });
}

// Buffers that overlap other than in a collective's in-place form would have a rank
// send bytes it is overwriting (a peer reading them by single copy raced with it
// under ThreadSanitizer). Every rank is refused alike, before anything is sent, and
// the communicator stays usable.
TEST(CollectiveArgumentsTest, OverlapOutsideTheInPlaceFormIsRefused) {
  RunRanks(3, TestOptions(TransportKind::kShm), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    const size_t count = 5;
    std::vector<float> buf(n * count * 2, 1.0f);
    float* blocks = buf.data();
    float* wrong_block = blocks + ((r + 1) % n) * count;  // not this rank's block
    const auto refused = [](const Status& s, const char* what) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.ToString();
      EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.ToString();
    };
    refused(comm.AllGather(wrong_block, blocks, count, DataType::kF32), "all_gather");
    refused(comm.AllGather(blocks + r * count + 1, blocks, count, DataType::kF32),
            "all_gather, a misaligned block");
    refused(comm.ReduceScatter(blocks, wrong_block, count, DataType::kF32, ReduceOp::kSum),
            "reduce_scatter");
    refused(comm.AllToAll(blocks, blocks, count, DataType::kF32), "all_to_all in place");
    refused(comm.AllToAll(blocks, blocks + count, count, DataType::kF32), "all_to_all, shifted");
    // Nothing was sent: the same communicator runs the in-place forms.
    ASSERT_OK(comm.AllGather(blocks + r * count, blocks, count, DataType::kF32));
    ASSERT_OK(
        comm.ReduceScatter(blocks, blocks + r * count, count, DataType::kF32, ReduceOp::kSum));
    ASSERT_OK(comm.AllToAll(blocks, blocks + n * count, count, DataType::kF32));
  });
  // A gather's receive buffer exists on its root only, which alone can check it (the
  // other ranks' sends would be left unmatched), so on a world of one here.
  RunRanks(1, TestOptions(TransportKind::kShm), [&](Communicator& comm) {
    std::vector<float> buf(8, 1.0f);
    const Status s = comm.Gather(buf.data() + 1, buf.data(), 4, DataType::kF32, 0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    ASSERT_OK(comm.Gather(buf.data(), buf.data(), 4, DataType::kF32, 0));  // in place
  });
}

TEST_P(CollectivesTest, SendRecvTagsBarrierAndSplit) {
  const Param p = GetParam();
  RunRanks(p.ranks, TestOptions(p.transport), [&](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    ASSERT_OK(comm.Barrier());
    if (n >= 2) {
      // Rank 0 sends tags 1, 2, 3 to rank 1, which receives them as 3, 1, 2.
      if (r == 0) {
        std::vector<int64_t> a(1000, 1), b(5000, 2), c(3, 3);
        ASSERT_OK(comm.Send(a.data(), a.size() * 8, 1, 1));
        ASSERT_OK(comm.Send(b.data(), b.size() * 8, 1, 2));
        ASSERT_OK(comm.Send(c.data(), c.size() * 8, 1, 3));
      } else if (r == 1) {
        std::vector<int64_t> a(1000), b(5000), c(3);
        auto rc = comm.Irecv(c.data(), c.size() * 8, 0, 3);
        ASSERT_TRUE(rc.ok());
        ASSERT_OK(rc->Wait());
        size_t got = 0;
        ASSERT_OK(comm.Recv(a.data(), a.size() * 8, 0, 1, &got));
        EXPECT_EQ(got, a.size() * 8);
        ASSERT_OK(comm.Recv(b.data(), b.size() * 8, 0, 2));
        EXPECT_EQ(a[999], 1);
        EXPECT_EQ(b[4999], 2);
        EXPECT_EQ(c[2], 3);
      }
      // Async ring exchange.
      std::vector<int32_t> out(100, r), in(100, -1);
      auto s = comm.Isend(out.data(), 400, (r + 1) % n, 9);
      auto q = comm.Irecv(in.data(), 400, (r - 1 + n) % n, 9);
      ASSERT_TRUE(s.ok() && q.ok());
      ASSERT_OK(q->Wait());
      ASSERT_OK(s->Wait());
      EXPECT_EQ(in[50], (r - 1 + n) % n);
    }
    // Sends to itself: buffered at once, matched by tag in order, before or after
    // the receive is posted; an unmatched receive from itself is an error, not a hang.
    {
      std::vector<int32_t> x(300, r + 7), y(300, -1), z(2, -1);
      const int32_t small[2] = {r, 42};
      ASSERT_OK(comm.Send(x.data(), x.size() * 4, r, 4));
      auto later = comm.Irecv(z.data(), 8, r, 5);
      ASSERT_TRUE(later.ok());
      ASSERT_OK(comm.Send(small, 8, r, 5));
      ASSERT_OK(later->Wait());
      EXPECT_EQ(z[1], 42);
      size_t got = 0;
      ASSERT_OK(comm.Recv(y.data(), y.size() * 4, r, 4, &got));
      EXPECT_EQ(got, 1200u);
      EXPECT_EQ(y[299], r + 7);
      Status orphan = comm.Recv(y.data(), 4, r, 6);
      EXPECT_FALSE(orphan.ok());
      EXPECT_NE(orphan.message().find("would wait forever"), std::string::npos)
          << orphan.ToString();
      {  // A receive from itself withdrawn with its request is not matched later.
        auto dropped = comm.Irecv(y.data(), 4, r, 8);
        ASSERT_TRUE(dropped.ok());
      }
      ASSERT_OK(comm.Send(small, 8, r, 8));
      ASSERT_OK(comm.Recv(z.data(), 8, r, 8));
      EXPECT_EQ(z[0], r);
    }
    // Split into even/odd ranks ordered by descending rank.
    auto sub = comm.Split(r % 2, -r);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    const int sub_size = (n - r % 2 + 1) / 2;
    ASSERT_EQ((*sub)->size(), sub_size);
    std::vector<int32_t> v(10, r), sum(10);
    ASSERT_OK((*sub)->AllReduce(v.data(), sum.data(), 10, DataType::kI32, ReduceOp::kSum));
    int expected = 0;
    for (int q = r % 2; q < n; q += 2) expected += q;
    EXPECT_EQ(sum[3], expected);
    // The ordering key: highest old rank gets new rank 0.
    int32_t mine = r, first = -1;
    if ((*sub)->rank() == 0) first = r;
    ASSERT_OK((*sub)->Broadcast(&first, 1, DataType::kI32, 0));
    int highest = r % 2;
    for (int q = r % 2; q < n; q += 2) highest = q;
    EXPECT_EQ(first, highest);
    (void)mine;
    // Color < 0 joins nothing.
    auto none = comm.Split(r == 0 ? -1 : 0, 0);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->get() == nullptr, r == 0);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, CollectivesTest,
    ::testing::Values(Param{1, TransportKind::kShm}, Param{2, TransportKind::kShm},
                      Param{3, TransportKind::kShm}, Param{4, TransportKind::kShm},
                      Param{5, TransportKind::kShm}, Param{8, TransportKind::kShm},
                      Param{1, TransportKind::kTcp}, Param{2, TransportKind::kTcp},
                      Param{3, TransportKind::kTcp}, Param{4, TransportKind::kTcp},
                      Param{5, TransportKind::kTcp}, Param{8, TransportKind::kTcp}),
    testing::WorldParamName);

// Over MPI (the sanitizer passes leave these out: Open MPI is not instrumented).
std::vector<Param> MpiParams() {
  if (!MpiBuilt()) return {};
  return {Param{2, TransportKind::kMpi}, Param{3, TransportKind::kMpi},
          Param{5, TransportKind::kMpi}};
}
INSTANTIATE_TEST_SUITE_P(Mpi, CollectivesTest, ::testing::ValuesIn(MpiParams()),
                         testing::WorldParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CollectivesTest);

}  // namespace
}  // namespace tessera::comm
