// The emulated TCP link delay (CommOptions::tcp_emulated_delay_us,
// TESSERA_TCP_DELAY_US): a round trip costs two delays, back-to-back messages
// pipeline, results stay exact, shared memory and delay 0 are unaffected. Ranks
// run as threads; lower bounds are strict, upper bounds leave room for a busy
// machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/bench/pattern.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

using testing::RunRanks;
using testing::TestOptions;

CommOptions DelayOptions(TransportKind transport, int64_t delay_us) {
  CommOptions options = TestOptions(transport);
  options.tcp_emulated_delay_us = delay_us;
  return options;
}

// Rank 0 times `rounds` 8-byte round trips with rank 1; returns each in ns.
std::vector<int64_t> PingPong(Communicator& comm, int rounds) {
  std::vector<int64_t> times;
  uint64_t value = 0;
  for (int i = 0; i < rounds; ++i) {
    if (comm.rank() == 0) {
      value = static_cast<uint64_t>(i) * 3 + 1;
      const int64_t start = NowNs();
      EXPECT_TRUE(comm.Send(&value, sizeof(value), 1, 7).ok());
      EXPECT_TRUE(comm.Recv(&value, sizeof(value), 1, 8).ok());
      times.push_back(NowNs() - start);
      EXPECT_EQ(value, static_cast<uint64_t>(i) * 3 + 2);
    } else {
      EXPECT_TRUE(comm.Recv(&value, sizeof(value), 0, 7).ok());
      ++value;
      EXPECT_TRUE(comm.Send(&value, sizeof(value), 0, 8).ok());
    }
  }
  return times;
}

TEST(TcpDelayTest, RoundTripTakesTwoDelays) {
  constexpr int64_t kDelayUs = 4000;
  RunRanks(2, DelayOptions(TransportKind::kTcp, kDelayUs), [&](Communicator& comm) {
    EXPECT_NE(comm.TransportTo(1 - comm.rank()).find("delay 4000 us"), std::string::npos)
        << comm.TransportTo(1 - comm.rank());
    auto times = PingPong(comm, 5);
    if (comm.rank() != 0) return;
    for (int64_t t : times) EXPECT_GE(t, 2 * kDelayUs * 1000);
    // One delay each way, not more (e.g. not once per chunk of a frame).
    EXPECT_LT(*std::min_element(times.begin(), times.end()), 4 * kDelayUs * 1000);
  });
}

TEST(TcpDelayTest, BackToBackMessagesPipeline) {
  constexpr int64_t kDelayUs = 4000;
  constexpr int kMessages = 20;
  RunRanks(2, DelayOptions(TransportKind::kTcp, kDelayUs), [&](Communicator& comm) {
    if (comm.rank() == 0) {
      const int64_t start = NowNs();
      for (int i = 0; i < kMessages; ++i) {
        uint64_t value = 1000 + static_cast<uint64_t>(i);
        ASSERT_OK(comm.Send(&value, sizeof(value), 1, i));
      }
      uint64_t ack = 0;
      ASSERT_OK(comm.Recv(&ack, sizeof(ack), 1, kMessages));
      const int64_t elapsed = NowNs() - start;
      EXPECT_EQ(ack, uint64_t{kMessages});
      // 20 messages out and an ack back: about two delays; unpipelined would
      // be 21 delays.
      EXPECT_GE(elapsed, 2 * kDelayUs * 1000);
      EXPECT_LT(elapsed, 8 * kDelayUs * 1000);
    } else {
      uint64_t ok = 0;
      int64_t first_ns = 0;
      for (int i = 0; i < kMessages; ++i) {
        uint64_t value = 0;
        ASSERT_OK(comm.Recv(&value, sizeof(value), 0, i));
        if (i == 0) first_ns = NowNs();
        ok += value == 1000 + static_cast<uint64_t>(i) ? 1 : 0;
      }
      // The 19 messages after the first arrive together, not one delay apart.
      EXPECT_LT(NowNs() - first_ns, 4 * kDelayUs * 1000);
      ASSERT_OK(comm.Send(&ok, sizeof(ok), 0, kMessages));
    }
  });
}

TEST(TcpDelayTest, CollectivesStayExact) {
  constexpr int64_t kDelayUs = 1000;
  for (int n : {2, 3}) {
    RunRanks(n, DelayOptions(TransportKind::kTcp, kDelayUs), [&](Communicator& comm) {
      // Sizes with tails (not multiples of the 8-byte chunk alignment) and one
      // large enough to span many stripes and chunks.
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, (size_t{1} << 20) + 3}) {
        for (DataType dtype : {DataType::kF32, DataType::kU8}) {
          const size_t bytes = count * DataTypeSize(dtype);
          std::vector<uint8_t> send(bytes + 1), expected(bytes + 1);
          FillPattern(send.data(), count, dtype, ReduceOp::kSum, comm.rank(), 0);
          FillExpected(expected.data(), count, dtype, ReduceOp::kSum, comm.size(), 0);
          ASSERT_OK(comm.AllReduce(send.data(), send.data(), count, dtype, ReduceOp::kSum));
          EXPECT_EQ(CountMismatches(send.data(), expected.data(), count, dtype), 0u)
              << "n " << n << " count " << count << " " << DataTypeName(dtype);
        }
      }
      // Out-of-order tags: the second message is buffered while the first waits.
      if (comm.rank() == 0) {
        std::vector<uint32_t> a(1001, 11), b(13, 22);
        ASSERT_OK(comm.Send(a.data(), a.size() * 4, 1, 1));
        ASSERT_OK(comm.Send(b.data(), b.size() * 4, 1, 2));
      } else if (comm.rank() == 1) {
        std::vector<uint32_t> a(1001), b(13);
        ASSERT_OK(comm.Recv(b.data(), b.size() * 4, 0, 2));
        ASSERT_OK(comm.Recv(a.data(), a.size() * 4, 0, 1));
        EXPECT_EQ(std::count(a.begin(), a.end(), 11u), 1001);
        EXPECT_EQ(std::count(b.begin(), b.end(), 22u), 13);
      }
      ASSERT_OK(comm.Barrier());
    });
  }
}

TEST(TcpDelayTest, SharedMemoryIsNeverDelayed) {
  constexpr int64_t kDelayUs = 50'000;
  RunRanks(2, DelayOptions(TransportKind::kShm, kDelayUs), [&](Communicator& comm) {
    EXPECT_EQ(comm.TransportTo(1 - comm.rank()), "shm");
    auto times = PingPong(comm, 5);
    if (comm.rank() == 0) {
      EXPECT_LT(*std::min_element(times.begin(), times.end()), kDelayUs * 1000 / 2);
    }
  });
}

TEST(TcpDelayTest, ZeroDelayIsPlainTcp) {
  RunRanks(2, DelayOptions(TransportKind::kTcp, 0), [&](Communicator& comm) {
    EXPECT_EQ(comm.TransportTo(1 - comm.rank()).find("delay"), std::string::npos);
    auto times = PingPong(comm, 5);
    if (comm.rank() == 0) {
      EXPECT_LT(*std::min_element(times.begin(), times.end()), int64_t{2'000'000});
    }
  });
}

TEST(TcpDelayTest, MismatchedDelayIsAnError) {
  auto store = std::make_shared<HashStore>();
  const std::string job = testing::UniqueJobId("delay");
  Status results[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CommOptions options = DelayOptions(TransportKind::kTcp, r == 0 ? 1000 : 0);
      options.job_id = job;
      options.timeout_ms = 10'000;
      auto comm = Communicator::Create(store, r, 2, options);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      results[r] = (*comm)->Barrier();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
  const std::string text = results[0].ToString() + " | " + results[1].ToString();
  EXPECT_NE(text.find("TESSERA_TCP_DELAY_US"), std::string::npos) << text;
}

// Communicator::SetWaitWork: while a collective waits on the (20 ms) link, the work
// runs a step at a time until it says none is left; it never stalls the collective,
// even when it never runs out; the results stay exact; cleared work is not called.
TEST(TcpDelayTest, WaitWorkRunsWhileACollectiveWaits) {
  RunRanks(2, DelayOptions(TransportKind::kTcp, 20'000), [&](Communicator& comm) {
    int steps = 0;
    comm.SetWaitWork([&steps] { return ++steps < 5; });
    std::vector<float> data = {1.0f + static_cast<float>(comm.rank()), 2.0f};
    ASSERT_OK(comm.AllReduce(data.data(), data.data(), 2, DataType::kF32, ReduceOp::kSum,
                             AllReduceAlgo::kDeterministic));
    EXPECT_EQ(steps, 5);
    EXPECT_EQ(data, (std::vector<float>{3.0f, 4.0f}));

    int endless = 0;
    comm.SetWaitWork([&endless] { return ++endless > 0; });
    const int64_t start = NowNs();
    ASSERT_OK(comm.AllReduce(data.data(), data.data(), 2, DataType::kF32, ReduceOp::kSum));
    EXPECT_LT(NowNs() - start, int64_t{5'000'000'000});
    EXPECT_GT(endless, 5);
    EXPECT_EQ(data, (std::vector<float>{6.0f, 8.0f}));

    comm.SetWaitWork({});
    const int before = endless;
    ASSERT_OK(comm.Barrier());
    EXPECT_EQ(endless, before);
  });
}

TEST(TcpDelayTest, OptionFromEnvironment) {
  ::unsetenv("TESSERA_TCP_DELAY_US");
  auto options = CommOptions::FromEnvironment();
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->tcp_emulated_delay_us, 0);
  ::setenv("TESSERA_TCP_DELAY_US", "2500", 1);
  options = CommOptions::FromEnvironment();
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->tcp_emulated_delay_us, 2500);
  ::setenv("TESSERA_TCP_DELAY_US", "-1", 1);
  EXPECT_FALSE(CommOptions::FromEnvironment().ok());
  ::unsetenv("TESSERA_TCP_DELAY_US");
}

}  // namespace
}  // namespace tessera::comm
