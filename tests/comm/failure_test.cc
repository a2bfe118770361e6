// Failure behaviour: kill -9 of a rank (shm and tcp) and SIGSTOP of a same-host
// rank make the others fail within seconds naming it; Abort() from another thread; deadlines;
// poisoning. Ranks are forked processes (rendezvous through a FileStore) or threads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/rendezvous/file_store.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

std::string TempDir(const std::string& what) {
  std::string dir = "/tmp/tessera-test-" + testing::UniqueJobId(what);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Child body: join, report ready, all-reduce until an error; write the error.
[[noreturn]] void LoopingRank(const std::string& dir, int rank, int size, TransportKind transport,
                              const std::string& job, size_t count, int64_t frozen_peer_ms) {
  auto store = FileStore::Open(dir + "/store");
  if (!store.ok()) ::_exit(10);
  CommOptions options;
  options.job_id = job;
  options.transport = transport;
  options.timeout_ms = 60'000;
  options.frozen_peer_ms = frozen_peer_ms;
  options.calibration = CalibrationMode::kOff;  // these measure failures, not copy modes
  auto comm = Communicator::Create(std::shared_ptr<Store>(std::move(*store)), rank, size, options);
  if (!comm.ok()) {
    std::ofstream(dir + "/error" + std::to_string(rank)) << comm.status().ToString();
    ::_exit(11);
  }
  std::vector<float> data(count, 1.0f);
  int iteration = 0;
  while (true) {
    Status s =
        (*comm)->AllReduce(data.data(), data.data(), data.size(), DataType::kF32, ReduceOp::kMax);
    if (!s.ok()) {
      std::ofstream(dir + "/error" + std::to_string(rank)) << s.ToString();
      // A later op must fail too (poisoned).
      Status later = (*comm)->Barrier();
      ::_exit(later.ok() ? 12 : 0);
    }
    if (++iteration == 20) std::ofstream(dir + "/ready" + std::to_string(rank)) << "1";
  }
}

// `count` floats per all-reduce: 64Ki takes the ring; 16 the one-shot mailbox on
// shared memory. `signal`: SIGKILL (dead) or SIGSTOP (frozen: alive, silent).
void KillOneRankMidOperation(TransportKind transport, size_t count = 64 << 10, int signal = SIGKILL,
                             const std::string& expected = "rank 2") {
  const int64_t frozen_peer_ms = 2'000;
  const int size = 3;
  const int victim = 2;
  std::string dir = TempDir("kill");
  std::string job = testing::UniqueJobId("kill");
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) LoopingRank(dir, r, size, transport, job, count, frozen_peer_ms);
    pids.push_back(pid);
  }
  // Wait until every rank is inside the all-reduce loop.
  Deadline ready = Deadline::AfterMs(60'000);
  for (int r = 0; r < size; ++r) {
    while (!std::filesystem::exists(dir + "/ready" + std::to_string(r)) && !ready.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_FALSE(ready.Expired()) << "ranks never became ready";
  ::kill(pids[victim], signal);
  int64_t killed_ns = NowNs();
  for (int r = 0; r < size; ++r) {
    int status = 0;
    if (r == victim) continue;
    // Each survivor must exit (error reported, later op refused) within 10 s.
    Deadline limit = Deadline::AfterMs(10'000);
    pid_t done = 0;
    while ((done = ::waitpid(pids[r], &status, WNOHANG)) == 0 && !limit.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], &status, 0);
      ADD_FAILURE() << "rank " << r << " did not fail within 10 s of the kill";
      continue;
    }
    double seconds = (NowNs() - killed_ns) * 1e-9;
    std::string error = ReadFile(dir + "/error" + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ": " << error;
    EXPECT_NE(error.find(expected), std::string::npos) << "rank " << r << ": " << error;
    std::printf("rank %d failed %.2f s after the signal: %s\n", r, seconds, error.c_str());
  }
  ::kill(pids[victim], SIGKILL);  // a stopped process dies too
  int status = 0;
  ::waitpid(pids[victim], &status, 0);
  std::filesystem::remove_all(dir);
}

TEST(FailureTest, KillNineShmRankFailsOthersNamingIt) {
  KillOneRankMidOperation(TransportKind::kShm);
}

TEST(FailureTest, KillNineShmRankDuringOneShotAllReduces) {
  KillOneRankMidOperation(TransportKind::kShm, 16);
}

// A frozen rank (SIGSTOP) is told from a slow one by its heartbeat: the others fail
// within frozen_peer_ms (2 s here) instead of waiting for the 60 s deadline.
TEST(FailureTest, StoppedShmRankFailsOthersNamingIt) {
  KillOneRankMidOperation(TransportKind::kShm, 64 << 10, SIGSTOP, "rank 2 (shm, pid");
}

TEST(FailureTest, StoppedShmRankDuringOneShotAllReduces) {
  KillOneRankMidOperation(TransportKind::kShm, 16, SIGSTOP, "stopped responding");
}

TEST(FailureTest, KillNineTcpRankFailsOthersNamingIt) {
  KillOneRankMidOperation(TransportKind::kTcp);
}

// Over TCP the heartbeat is a counter in the store (the connection of a stopped
// process stays open): the others fail within ~frozen_peer_ms too.
TEST(FailureTest, StoppedTcpRankFailsOthersNamingIt) {
  KillOneRankMidOperation(TransportKind::kTcp, 64 << 10, SIGSTOP, "stopped responding");
}

TEST(FailureTest, AbortFromAnotherThreadUnblocksAndPoisons) {
  for (TransportKind transport : {TransportKind::kShm, TransportKind::kTcp}) {
    testing::RunRanks(2, testing::TestOptions(transport), [&](Communicator& comm) {
      int64_t start = NowNs();
      std::vector<uint8_t> buf(64);
      if (comm.rank() == 0) {
        std::thread aborter([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comm.Abort("test abort");
        });
        Status s = comm.Recv(buf.data(), buf.size(), 1, 5);  // never sent
        aborter.join();
        EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
        EXPECT_NE(s.message().find("test abort"), std::string::npos) << s.ToString();
        Status later = comm.Barrier();
        EXPECT_FALSE(later.ok());
        EXPECT_NE(later.message().find("unusable after an earlier error"), std::string::npos)
            << later.ToString();
      } else {
        // Waits on rank 0, which aborts: must fail promptly naming rank 0.
        Status s = comm.Recv(buf.data(), buf.size(), 0, 6);
        EXPECT_FALSE(s.ok());
        EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.ToString();
      }
      EXPECT_LT((NowNs() - start) * 1e-9, 10.0);
    });
  }
}

TEST(FailureTest, DeadlineNamesThePendingPeer) {
  testing::RunRanks(2, testing::TestOptions(TransportKind::kShm), [&](Communicator& comm) {
    if (comm.rank() == 0) {
      comm.set_timeout_ms(300);
      int64_t start = NowNs();
      std::vector<uint8_t> buf(8);
      Status s = comm.Recv(buf.data(), buf.size(), 1, 1);
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
      EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
      EXPECT_LT((NowNs() - start) * 1e-9, 5.0);
    } else {
      std::vector<uint8_t> buf(8);
      comm.set_timeout_ms(5000);
      Status s = comm.Recv(buf.data(), buf.size(), 0, 2);  // fails once rank 0 poisons
      EXPECT_FALSE(s.ok());
    }
  });
}

TEST(FailureTest, OneShotDeadlineNamesTheMissingPeer) {
  testing::RunRanks(3, testing::TestOptions(TransportKind::kShm), [&](Communicator& comm) {
    std::vector<float> v(8, 1.0f);
    if (comm.rank() == 2) {  // never joins the all-reduce; fails once the others poison
      std::vector<uint8_t> buf(8);
      comm.set_timeout_ms(5000);
      EXPECT_FALSE(comm.Recv(buf.data(), buf.size(), 0, 1).ok());
      return;
    }
    // Rank 0 times out first; rank 1 then fails because rank 0 did.
    comm.set_timeout_ms(comm.rank() == 0 ? 300 : 5000);
    int64_t start = NowNs();
    Status s = comm.AllReduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum,
                              AllReduceAlgo::kOneShot);
    if (comm.rank() == 0) {
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    }
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.ToString();
    EXPECT_LT((NowNs() - start) * 1e-9, 4.0);
  });
}

}  // namespace
}  // namespace tessera::comm
