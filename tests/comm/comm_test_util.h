// Helpers for the comm tests: run N ranks as threads of this process over a
// shared HashStore, each with its own Communicator. Test-only.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/unique_fd.h"
#include "comm/communicator.h"
#include "comm/net_util.h"
#include "comm/rendezvous/hash_store.h"
#include "comm/transport/tcp_channel.h"

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    ::tessera::Status assert_ok_status_ = (expr);                        \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_.ToString(); \
  } while (0)

namespace tessera::comm::testing {

inline std::string UniqueJobId(const std::string& what) {
  static std::atomic<int> counter{0};
  return what + std::to_string(::getpid()) + "x" + std::to_string(counter.fetch_add(1));
}

// Two connected nonblocking stream sockets.
inline std::pair<UniqueFd, UniqueFd> SocketPair() {
  int fds[2];
  TESSERA_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  SetNonBlocking(fds[0]);
  SetNonBlocking(fds[1]);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// A one-connection TCP channel over `fd` (a socketpair end will do).
inline std::unique_ptr<Channel> TcpOver(UniqueFd fd) {
  std::vector<UniqueFd> conn;
  conn.push_back(std::move(fd));
  return std::make_unique<TcpChannel>(std::move(conn), 1 << 20, "peer:1");
}

inline CommOptions TestOptions(TransportKind transport) {
  CommOptions options;
  options.transport = transport;
  options.timeout_ms = 60'000;
  options.shm_ring_bytes = size_t{256} << 10;  // small rings exercise wrap-around
  options.shm_chunk_bytes = size_t{16} << 10;
  options.tcp_connections = 2;
  options.tcp_stripe_bytes = 8192;  // small stripes exercise striping
  // Messages from 64 KiB are copied past the cache, smaller ones by memcpy: both
  // paths run.
  options.copy_bypass_cache_bytes = size_t{64} << 10;
  // Same-host messages from 64 KiB go as single copy (off by default),
  // smaller ones through the ring: both paths run at test sizes.
  options.shm_single_copy_bytes = size_t{64} << 10;
  options.shm_single_copy_source = SettingSource::kEnv;  // set here: no calibration
  return options;
}

// A world size and transport, for tests parameterised over both.
struct WorldParam {
  int ranks;
  TransportKind transport;
};

inline std::string WorldParamName(const ::testing::TestParamInfo<WorldParam>& info) {
  return std::string(TransportKindName(info.param.transport)) + "_np" +
         std::to_string(info.param.ranks);
}

// Runs fn(comm) on `n` threads, one communicator each; fails the test on setup errors.
inline void RunRanks(int n, const CommOptions& options,
                     const std::function<void(Communicator&)>& fn) {
  auto store = std::make_shared<HashStore>();
  CommOptions opts = options;
  opts.job_id = UniqueJobId("t");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::Create(store, r, n, opts);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace tessera::comm::testing
