// The machine's own limits, measured in the same run as the collectives so the
// benchmark can be read against them: memory copy bandwidth (1 and 2 threads), TCP
// loopback bandwidth between two rank processes (one way, and both ways at once as a
// 2-rank all-reduce moves data, from 1 MiB buffers that stay in the caches; then one
// way again through buffers far larger than them), and the cache-line round trip
// between two cores (which drifts on this kind of VM and moves small-message latency).
// Layer: comm (benchmark support). Collective: every rank of `comm` calls it.
#pragma once

#include "base/status.h"
#include "comm/communicator.h"

namespace tessera::comm {

struct RawBaseline {
  double memcpy_1t_gbps = 0;
  double memcpy_2t_gbps = 0;
  double tcp_one_way_gbps = 0;    // 0 when fewer than 2 ranks
  double tcp_both_ways_gbps = 0;  // per direction, both directions at once
  // One way again, out of and into kLargeTcpBufferBytes buffers (past the caches).
  double tcp_one_way_memory_gbps = 0;
  double cacheline_roundtrip_us = 0;  // 0 when fewer than 2 CPUs
};

// The buffers the third TCP figure sends from and receives into, each.
inline constexpr size_t kLargeTcpBufferBytes = size_t{64} << 20;

// Rank 0 measures memory and the round trip; ranks 0 and 1 measure TCP. Every
// rank returns rank 0's figures.
Result<RawBaseline> MeasureRawBaseline(Communicator& comm, size_t tcp_bytes);

// Cache-line ping-pong between two threads pinned to CPUs 0 and 1 (µs per round trip).
double MeasureCacheLineRoundTripUs(int iterations);

}  // namespace tessera::comm
