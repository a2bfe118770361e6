#include "comm/bench/raw_baseline.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/memory_bandwidth.h"
#include "comm/net_util.h"

namespace tessera::comm {
namespace {

void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Moves `send_bytes` out and/or `recv_bytes` in over `fd` with one thread and
// poll(), like the transport, in calls of up to kPumpPiece bytes that walk through
// buf's two halves (out of the first, into the second) and wrap around at their end:
// a small buffer stays in the caches, a large one makes every byte come from memory
// and go back to it, as a collective's large message does.
constexpr size_t kPumpPiece = size_t{1} << 20;

Status Pump(int fd, size_t send_bytes, size_t recv_bytes, std::vector<uint8_t>& buf) {
  const size_t half = buf.size() / 2;
  uint8_t* const out = buf.data();
  uint8_t* const in = buf.data() + half;
  const auto piece = [&](size_t done, size_t total) {
    return std::min({kPumpPiece, half - done % half, total - done});
  };
  size_t sent = 0, received = 0;
  Deadline deadline = Deadline::AfterMs(120'000);
  while (sent < send_bytes || received < recv_bytes) {
    bool progressed = false;
    if (sent < send_bytes) {
      ssize_t n =
          ::send(fd, out + sent % half, piece(sent, send_bytes), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progressed = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return UnavailableError(std::string("baseline send: ") + std::strerror(errno));
      }
    }
    if (received < recv_bytes) {
      ssize_t n = ::recv(fd, in + received % half, piece(received, recv_bytes), MSG_DONTWAIT);
      if (n > 0) {
        received += static_cast<size_t>(n);
        progressed = true;
      } else if (n == 0) {
        return UnavailableError("baseline peer closed");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return UnavailableError(std::string("baseline recv: ") + std::strerror(errno));
      }
    }
    if (!progressed) {
      if (deadline.Expired()) return DeadlineExceededError("baseline TCP transfer timed out");
      pollfd p{fd,
               static_cast<short>((sent < send_bytes ? POLLOUT : 0) |
                                  (received < recv_bytes ? POLLIN : 0)),
               0};
      ::poll(&p, 1, 100);
    }
  }
  return Status::Ok();
}

}  // namespace

double MeasureCacheLineRoundTripUs(int iterations) {
  if (std::thread::hardware_concurrency() < 2) return 0;
  alignas(64) std::atomic<int> ball{0};
  std::thread partner([&] {
    PinToCpu(1);
    for (int i = 0; i < iterations; ++i) {
      while (ball.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      ball.store(2 * i + 2, std::memory_order_release);
    }
  });
  PinToCpu(0);
  // Warm up, then time.
  int64_t start = 0;
  const int warm = iterations / 10;
  for (int i = 0; i < iterations; ++i) {
    if (i == warm) start = NowNs();
    ball.store(2 * i + 1, std::memory_order_release);
    while (ball.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  int64_t elapsed = NowNs() - start;
  partner.join();
  cpu_set_t all;
  CPU_ZERO(&all);
  for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) CPU_SET(c, &all);
  pthread_setaffinity_np(pthread_self(), sizeof(all), &all);
  return static_cast<double>(elapsed) * 1e-3 / (iterations - warm);
}

Result<RawBaseline> MeasureRawBaseline(Communicator& comm, size_t tcp_bytes) {
  RawBaseline b;
  const int r = comm.rank();
  if (r == 0) {
    MemoryBandwidthOptions mo;
    mo.buffer_bytes = size_t{128} << 20;
    mo.repetitions = 3;
    b.memcpy_1t_gbps = MeasureMemoryBandwidth(mo).copy_bytes_per_s * 1e-9;
    mo.num_threads = 2;
    mo.buffer_bytes = size_t{64} << 20;
    b.memcpy_2t_gbps = MeasureMemoryBandwidth(mo).copy_bytes_per_s * 1e-9;
    b.cacheline_roundtrip_us = MeasureCacheLineRoundTripUs(200'000);
  }
  TESSERA_RETURN_IF_ERROR(comm.Barrier());
  if (comm.size() >= 2) {
    int32_t port = 0;
    UniqueFd listener, fd;
    if (r == 0) {
      TESSERA_ASSIGN_OR_RETURN(listener, ListenTcp("127.0.0.1", 0, &port));
    }
    TESSERA_RETURN_IF_ERROR(comm.Broadcast(&port, 1, DataType::kI32, 0));
    if (r == 0) {
      TESSERA_ASSIGN_OR_RETURN(fd, AcceptTcp(listener.get(), Deadline::AfterMs(30'000)));
    } else if (r == 1) {
      TESSERA_ASSIGN_OR_RETURN(fd,
                               ConnectTcp(HostPort{"127.0.0.1", port}, Deadline::AfterMs(30'000)));
    }
    std::vector<uint8_t> cached(size_t{2} << 20, 1);
    std::vector<uint8_t> large(r <= 1 ? 2 * kLargeTcpBufferBytes : 0, 1);
    double times[3] = {0, 0, 0};
    // 0: one way 1 -> 0; 1: both ways; 2: one way through buffers past the caches.
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<uint8_t>& buf = mode == 2 ? large : cached;
      TESSERA_RETURN_IF_ERROR(comm.Barrier());
      int64_t start = NowNs();
      if (r == 0) {
        TESSERA_RETURN_IF_ERROR(Pump(fd.get(), mode == 1 ? tcp_bytes : 0, tcp_bytes, buf));
      } else if (r == 1) {
        TESSERA_RETURN_IF_ERROR(Pump(fd.get(), tcp_bytes, mode == 1 ? tcp_bytes : 0, buf));
      }
      times[mode] = static_cast<double>(NowNs() - start) * 1e-9;
      // Rank 1 may still be draining; the slower side defines the time.
      int64_t ns = static_cast<int64_t>(times[mode] * 1e9);
      TESSERA_RETURN_IF_ERROR(comm.AllReduce(&ns, &ns, 1, DataType::kI64, ReduceOp::kMax));
      times[mode] = static_cast<double>(ns) * 1e-9;
    }
    b.tcp_one_way_gbps = static_cast<double>(tcp_bytes) / times[0] * 1e-9;
    b.tcp_both_ways_gbps = static_cast<double>(tcp_bytes) / times[1] * 1e-9;
    b.tcp_one_way_memory_gbps = static_cast<double>(tcp_bytes) / times[2] * 1e-9;
  }
  // Share rank 0's memory figures.
  double figures[3] = {b.memcpy_1t_gbps, b.memcpy_2t_gbps, b.cacheline_roundtrip_us};
  int64_t bits[3];
  std::memcpy(bits, figures, sizeof(bits));
  TESSERA_RETURN_IF_ERROR(comm.Broadcast(bits, 3, DataType::kI64, 0));
  std::memcpy(figures, bits, sizeof(bits));
  b.memcpy_1t_gbps = figures[0];
  b.memcpy_2t_gbps = figures[1];
  b.cacheline_roundtrip_us = figures[2];
  return b;
}

}  // namespace tessera::comm
