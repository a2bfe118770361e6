// The collective benchmark behind `tessera bench comm`: nccl-tests-style tables
// (size, count, type, redop, algo, time, algbw, busbw, #wrong) per operation,
// optional correctness check, JSON records, the raw machine baseline, the copy
// mode in force (and the calibration behind it) and the ledger. Layer: comm
// (benchmark support). Collective: every rank of the communicator calls
// RunCommBench; rank 0 prints.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/types.h"

namespace tessera::comm {

struct CommBenchOptions {
  // allreduce, allgather, reducescatter, alltoall, alltoallv (uniform per-peer counts),
  // alltoallvskew (skewed per-peer counts), broadcast, reduce, gather,
  // scatter, sendrecv (or "all").
  std::vector<std::string> ops = {"all"};
  DataType dtype = DataType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  std::string algo = "auto";  // for allreduce (ring|rd|deterministic), allgather
                              // (ring|bruck), broadcast (tree|chain)
  size_t min_bytes = 8;
  size_t max_bytes = size_t{256} << 20;
  int step_factor = 2;
  int iters = 0;  // 0 = automatic (about target_ms per size)
  int warmup = 3;
  double target_ms = 50;
  bool check = false;
  bool baseline = false;
  // Send and receive buffers from Communicator::AllocateShared (nccl-tests' -R):
  // same-host peers read them in place.
  bool shared_buffers = false;
  // Print the copy-mode calibration's measured table under the header.
  bool calibration_table = false;
  std::string json_path;  // "" = none
  std::string label;      // extra text for the header (transport, spin, …)
};

// The nccl-tests bus-bandwidth factor of an op for n ranks.
double BusBandwidthFactor(const std::string& op, int n);
// Canonical op names; InvalidArgument for unknown ones.
Result<std::vector<std::string>> ExpandBenchOps(const std::vector<std::string>& ops);

Status RunCommBench(Communicator& comm, const CommBenchOptions& options, FILE* out);

}  // namespace tessera::comm
