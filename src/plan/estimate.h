// The cost model: memory per device, time of a prefill and a decode step (roofline
// compute + alpha-beta communication + pipeline bubble), and from them TTFT, TPOT,
// throughput and end-to-end latency of a layout serving a workload. Layer: plan.
// Formulas are spelled out in docs/plan.md.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"
#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/model_shape.h"
#include "plan/traffic.h"
#include "plan/workload.h"

namespace tessera::plan {

struct MemoryPerDevice {
  int64_t weight_bytes = 0;          // the busiest stage's shard
  int64_t activation_bytes = 0;      // working buffers of the largest pass
  int64_t usable_bytes = 0;          // memory × memory_utilization
  int64_t kv_bytes_per_token = 0;    // one token of one sequence, this device's share
  int64_t kv_capacity_tokens = 0;    // tokens this device can cache
  int64_t max_seqs_per_replica = 0;  // whole sequences (prompt + output) one replica holds
};

// ResourceExhausted naming what does not fit ("weights 131 GiB + activations … exceed
// the 72 GB usable per device").
Result<MemoryPerDevice> DeviceMemory(const ModelShape& model, const Cluster& cluster,
                                     const Workload& workload, const Parallelism& p);

// Weight bytes one device of `stage` holds.
int64_t StageWeightBytes(const ModelShape& model, const DType& weight_dtype, const Parallelism& p,
                         int64_t stage);

struct StageWork {
  double flops = 0;
  double bytes = 0;         // memory traffic: weights read, KV read and written
  double weight_bytes = 0;  // the weights' share of `bytes`
  // Roofline: max(flops / FLOP/s, weight_bytes / weight-read rate + the rest /
  // bandwidth), with the device's measured kernel rates for the weight format when
  // the cluster file has them (DeviceSpec::WeightReadGbps, MatMulTflops).
  double seconds = 0;
  bool memory_bound = false;
};

// The compute of one device of `stage` in `pass`, while `busy_devices` devices of its
// node compute at once (they share a CPU node's memory bandwidth; 0 = every device
// the layout puts on the node).
StageWork StageCompute(const ModelShape& model, const Cluster& cluster, const Workload& workload,
                       const Parallelism& p, const Pass& pass, int64_t stage,
                       int64_t busy_devices = 0);

// Devices of one node that compute at the same time when `concurrent_stages` of the
// layout's stages are busy at once (a pipeline with fewer micro-batches than stages
// leaves the others waiting).
int64_t BusyDevicesPerNode(const Cluster& cluster, const Parallelism& p, int64_t concurrent_stages);

struct PassTime {
  Pass pass;  // the per-stage-visit pass (a micro-batch under pp)
  int64_t micro_batches = 1;
  double seconds = 0;             // prefill: latency through all stages; decode: TPOT
  double round_trip_seconds = 0;  // one micro-batch through every stage and back (pp)
  double occupancy_seconds = 0;   // how long the pass keeps the busiest stage busy
  double compute_seconds = 0;     // busiest stage
  double comm_seconds = 0;        // busiest stage's tp/ep/cp collectives
  double p2p_seconds = 0;         // one stage boundary
  double flops = 0;               // busiest stage
  double bytes = 0;
  bool memory_bound = false;
  double bubble_fraction = 0;  // pipeline stages idle share
  std::vector<CommItem> comm;  // per stage visit
};

struct Estimate {
  Layout layout;
  MemoryPerDevice memory;  // decode (or only) instances
  std::optional<MemoryPerDevice> prefill_memory;
  int64_t seqs_per_replica = 1;  // decode batch of one replica
  bool kv_limited = false;       // the concurrency asked for did not fit the KV cache
  bool batch_capped = false;     // ... or exceeded workload.max_batch_seqs per replica
  bool overloaded = false;       // a request rate above what the layout sustains
  double concurrency = 1;        // sequences in flight, all replicas
  PassTime prefill;              // one prompt
  PassTime decode;               // one decode step
  std::optional<CommItem> kv_transfer;
  double kv_transfer_seconds = 0;
  double prefill_stall_seconds = 0;  // colocated: prefills interleaved, per decode step
  double ttft_seconds = 0;
  double tpot_seconds = 0;             // including prefill stalls
  double e2e_seconds = 0;              // TTFT + (output-1) × TPOT
  double throughput_tokens_per_s = 0;  // output tokens, whole deployment
  int64_t decode_bytes_per_step = 0;   // busiest rank's sent bytes per decode step
};

// One point of a layout's latency/throughput curve.
struct SweepPoint {
  int64_t concurrency = 1;
  double tpot_seconds = 0;
  double throughput_tokens_per_s = 0;
};

// The layout at concurrency 1, 2, 4, … up to `max_concurrency` (stopping once its
// KV cache or batch cap is reached): how TPOT grows as throughput does.
std::vector<SweepPoint> SweepConcurrency(const ModelShape& model, const Cluster& cluster,
                                         const Workload& workload, const Layout& layout,
                                         int64_t max_concurrency);

// InvalidArgument when the layout cannot divide the model, ResourceExhausted when it
// does not fit.
Result<Estimate> EstimateLayout(const ModelShape& model, const Cluster& cluster,
                                const Workload& workload, const Layout& layout);

}  // namespace tessera::plan
