// Workload: what the planned deployment serves — prompt and output lengths, how
// many sequences are in flight, the number formats — and the model-independent
// knobs of the cost model. Layer: plan (pure data).
#pragma once

#include <cstdint>
#include <optional>

#include "plan/collectives.h"
#include "plan/dtype.h"

namespace tessera::plan {

struct Workload {
  int64_t prompt_tokens = 512;
  int64_t output_tokens = 128;
  // Sequences in flight across the whole deployment (each DP replica takes
  // ⌈concurrency/dp⌉). Ignored when request_rate > 0.
  int64_t concurrency = 1;
  // Requests per second; when > 0 the concurrency is derived by Little's law
  // (in flight = rate × end-to-end latency), iterated to a fixed point.
  double request_rate = 0;
  DType weight_dtype{"bf16", 1, 2};
  DType kv_dtype{"f16", 1, 2};
  // Activations as they travel between ranks (tessera's CPU engine computes in f32).
  DType act_dtype{"f32", 1, 4};
  // Largest decode batch one replica runs (vLLM's max_num_seqs); more sequences queue.
  int64_t max_batch_seqs = 256;
  // Share of device memory the deployment may use (vLLM's gpu_memory_utilization).
  double memory_utilization = 0.9;
  // Forced all-reduce / all-gather algorithms (comm's TESSERA_ALLREDUCE_ALGO,
  // TESSERA_ALLGATHER_ALGO); nullopt = comm's automatic choice by size, with its
  // thresholds (TESSERA_ALLREDUCE_SMALL_BYTES; 16 KiB per rank for Bruck).
  std::optional<AllReduceAlgo> allreduce_algo;
  std::optional<AllGatherAlgo> allgather_algo;
  int64_t allreduce_small_bytes = int64_t{32} << 10;
  // comm's one-shot mailbox (TESSERA_ALLREDUCE_ONESHOT_BYTES), used by a group
  // whose ranks share a node; 0 = never (e.g. TESSERA_TRANSPORT=tcp).
  int64_t allreduce_oneshot_bytes = int64_t{32} << 10;
  int64_t allgather_small_bytes = int64_t{16} << 10;
};

}  // namespace tessera::plan
