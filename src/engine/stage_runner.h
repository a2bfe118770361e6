// The tensor/pipeline-parallel runtime: every rank binds its shard of the model
// (ParallelPlan::ShardOf) and its own KV cache (its layers, its KV heads, the same
// block count everywhere), and runs the steps the driver describes.
//
// One step, on the rank at (stage s, tp rank t):
//   1. its StepMessage arrives: from the driver on stage 0, from (s-1, t) after;
//   2. stage 0 embeds the tokens (vocab shards, all-reduced); later stages receive
//      the residual stream [T, dim] from (s-1, t) on the PP group;
//   3. its layers run, with two all-reduces per layer on the TP group;
//   4. it forwards the message and the residual stream to (s+1, t), or, on the last
//      stage, computes its vocab rows of the logits and gathers them to the driver.
// Messages go on the "ctl" group (a copy of the world, so its bytes are counted
// apart from the model's data), activations on "pp", collectives on "tp". The
// driver keeps up to pp steps in flight (one micro-batch per stage), so stages
// overlap. Every failure — a dead peer, a timeout, a malformed message — returns
// an error naming the rank; the caller aborts the world so no one waits forever.
// Layer: engine. Not thread-safe: each rank's runtime is driven by one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "comm/communicator.h"
#include "engine/step_executor.h"
#include "kernels/attention.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "parallel/groups.h"
#include "parallel/plan.h"
#include "parallel/step_message.h"

namespace tessera::engine {

// About what one core streams from memory in a 0.1 ms network wait (~25 GB/s).
inline constexpr int64_t kDefaultTpPrefetchBytes = int64_t{2} << 20;

struct RuntimeOptions {
  kernels::KvType kv_type = kernels::KvType::kF16;
  int32_t block_size = 16;
  int64_t kv_capacity_tokens = 0;  // KV capacity per rank, in tokens (0 = the model's)
  int64_t max_step_tokens = 0;     // receivers refuse larger steps (0 = kv_capacity_tokens)
  int64_t max_step_sequences = 256;
  // true: the deterministic all-reduce (bit-identical to one rank); false: the
  // library's fastest choice (ring / recursive doubling), results may differ in
  // the last bits.
  bool deterministic = true;
  // Keep per-step ledger deltas on every rank (the driver's report carries them).
  bool record_traffic = false;
  // Under tp > 1 with a peer over TCP: bytes of the next matrix to prefetch while
  // an all-reduce waits for the network (kernels::MatMulPrefetcher); 0 = off,
  // -1 = TESSERA_TP_PREFETCH_BYTES or kDefaultTpPrefetchBytes. Not between
  // same-host peers: there the wait is for a peer that streams its own weights
  // over the same memory bus, and prefetching slows it down (README).
  int64_t tp_prefetch_bytes = -1;
};

// Where one rank's time went, per step class (decode: every sequence brings one
// token; prefill: any other step).
struct TimeShare {
  int64_t steps = 0;
  int64_t compute_ns = 0;  // kernels
  int64_t comm_ns = 0;     // all-reduces, gathers, sends (includes waiting for slower peers)
  int64_t wait_ns = 0;     // idle, waiting for the upstream stage's message and activations
};

// Bytes one rank moved in one step, per "group/primitive" (ledger names).
struct StepTraffic {
  uint64_t step_id = 0;
  bool decode = false;
  int64_t sequences = 0;
  int64_t tokens = 0;   // new tokens of the step
  int64_t context = 0;  // tokens cached before the step, summed over sequences
  int64_t logit_rows = 0;
  std::map<std::string, comm::LedgerEntry> bytes;
};

struct RankReport {
  int rank = 0;
  int stage = 0;
  int tp_rank = 0;
  int64_t weight_bytes = 0;    // the shard's weights
  int64_t kv_bytes = 0;        // its KV cache
  int64_t peak_rss_bytes = 0;  // VmHWM
  std::string links;           // transport to each world rank: "shm shm tcp tcp"
  TimeShare decode, prefill;
  std::vector<StepTraffic> traffic;  // recorded when RuntimeOptions asks (driver's report)
};

using parallel::Groups;
using parallel::ParallelPlan;
using parallel::StepMessage;

class StageRunner;

// A worker rank (not the driver): serves steps until the driver's stop message.
Status ServeWorker(StageRunner& runner);

// The driver rank's StepExecutor: sends each step's message into the pipeline and
// collects the gathered logits. Shutdown() stops the workers and collects their
// reports (call it once, after the last step).
class Driver final : public StepExecutor {
 public:
  explicit Driver(StageRunner& runner);
  ~Driver() override;

  int64_t vocab_size() const override;
  int32_t num_kv_blocks() const override;
  int32_t kv_block_size() const override;
  int max_in_flight() const override;
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override;
  Result<std::span<const float>> Collect() override;
  double last_step_comm_seconds() const override;

  // Stops every worker and returns all ranks' reports, by rank.
  Result<std::vector<RankReport>> Shutdown();

 private:
  StageRunner& runner_;
  std::deque<StepMessage> in_flight_;
  std::vector<float> logits_;
  uint64_t next_step_id_ = 0;
  bool stopped_ = false;
};

// One rank's shard, KV cache and groups.
class StageRunner {
 public:
  // Binds the shard of `rank` from `file` (must outlive the runner) and allocates
  // its KV cache. `groups` may be empty for a world of one.
  static Result<std::unique_ptr<StageRunner>> Create(const ParallelPlan& plan, int rank,
                                                     Groups groups, const model::GgufFile& file,
                                                     ThreadPool& pool,
                                                     const RuntimeOptions& options);
  ~StageRunner();

  const ParallelPlan& plan() const { return plan_; }
  int rank() const { return rank_; }
  int stage() const { return stage_; }
  int tp_rank() const { return tp_rank_; }
  bool is_driver() const { return rank_ == plan_.driver_rank(); }
  const model::LlamaModel& model() const { return *model_; }
  const kv::KvCache& cache() const { return cache_; }
  Groups& groups() { return groups_; }
  RankReport Report() const;

 private:
  friend class Driver;
  friend Status ServeWorker(StageRunner& runner);
  class TpOps;

  StageRunner(const ParallelPlan& plan, int rank, Groups groups, ThreadPool& pool,
              const RuntimeOptions& options, std::unique_ptr<model::LlamaModel> model,
              kv::KvCache cache);

  // The world rank this rank's step messages come from.
  int upstream() const;
  Status SendStep(const StepMessage& message, int to);
  // idle: waiting for work that may not come for a while (a worker between
  // requests): no deadline, though a dead sender is still detected at once.
  Result<StepMessage> ReceiveStep(int from, bool idle = false);
  // Runs `message` on this rank (see the file comment). On the driver, `logits`
  // receives the gathered logits [rows, vocab].
  Status RunStep(const StepMessage& message, std::vector<float>* logits);
  Status GatherLogits(std::vector<float>* logits);
  std::map<std::string, comm::LedgerEntry> LedgerSnapshot() const;

  ParallelPlan plan_;
  int rank_, stage_, tp_rank_;
  Groups groups_;
  ThreadPool& pool_;
  RuntimeOptions options_;
  parallel::StepLimits limits_;
  std::unique_ptr<model::LlamaModel> model_;
  kv::KvCache cache_;
  std::vector<model::KvLayerView> kv_layers_;
  std::unique_ptr<TpOps> tp_ops_;
  model::LlamaScratch scratch_;
  std::vector<float> head_logits_;  // this rank's vocab rows
  std::vector<float> gathered_;     // the driver's [tp, rows, vocab_block]
  std::vector<uint8_t> header_buf_, payload_buf_;
  uint64_t expected_step_id_ = 0;
  bool record_traffic_ = false;
  TimeShare decode_, prefill_;
  int64_t comm_ns_ = 0;          // accumulated by the current step's communication
  int64_t pending_wait_ns_ = 0;  // waiting for the current step's message
  int64_t last_comm_ns_ = 0;     // the last finished step's comm_ns_
  std::vector<StepTraffic> traffic_;
};

// This process's peak resident memory (VmHWM), 0 if unknown.
int64_t PeakRssBytes();

}  // namespace tessera::engine
