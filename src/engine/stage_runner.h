// StageRunner: the one runner of every rank, on one rank and on many. Every rank binds its shard of
// the model (Partition::ShardOf) and its own KV cache (its layers, its KV heads, the same block
// count everywhere), and runs the steps the driver describes.
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
// driver accepts up to pp steps in flight (one micro-batch per stage), so stages
// overlap. Every failure — a dead peer, a timeout, a malformed message — returns
// an error naming the rank; the caller aborts the world so no one waits forever.
// Layer: engine. Not thread-safe: each rank's runtime is driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "comm/communicator.h"
#include "engine/rank_report.h"
#include "engine/tp_all_reduce.h"
#include "kernels/attention.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "parallel/groups.h"
#include "parallel/partition.h"
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
  // over the same memory bus, and prefetching slows it down (docs/parallel.md, "Warming the next
  // matrix").
  int64_t tp_prefetch_bytes = -1;
};

// The KV cache `model` needs on this rank (its layers and KV heads) for
// `kv_capacity_tokens` tokens (0: the model's context length), in blocks of
// `block_size` tokens. InvalidArgument on a bad shape or an oversized context.
Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, kernels::KvType type,
                                  int32_t block_size, int64_t kv_capacity_tokens);

using parallel::Groups;
using parallel::Partition;
using parallel::StepMessage;

// One rank's shard, KV cache and groups, and the step protocol between ranks:
// the Driver (driver.h) and the worker loop (worker.h) are built on the public
// calls below.
class StageRunner {
 public:
  // Binds the shard of `rank` from `file` (must outlive the runner) and allocates
  // its KV cache. `groups` may be empty for a world of one. A malformed
  // TESSERA_TP_PREFETCH_BYTES is InvalidArgument.
  static Result<std::unique_ptr<StageRunner>> Create(const Partition& plan, int rank, Groups groups,
                                                     const model::GgufFile& file, ThreadPool& pool,
                                                     const RuntimeOptions& options);
  // A world of one over a whole model and a KV cache bound elsewhere (both must
  // outlive the runner): how tests and `tessera bench model` share one loaded model
  // between runners. The options' KV fields are ignored (the cache is given).
  static Result<std::unique_ptr<StageRunner>> CreateLocal(const model::LlamaModel& model,
                                                          kv::KvCache& cache, ThreadPool& pool,
                                                          const RuntimeOptions& options = {});
  ~StageRunner();
  // Held by pointer: its threads and hooks refer to it.
  StageRunner(const StageRunner&) = delete;
  StageRunner& operator=(const StageRunner&) = delete;

  const Partition& plan() const { return plan_; }
  int rank() const { return rank_; }
  int stage() const { return stage_; }
  int tp_rank() const { return tp_rank_; }
  int cp_rank() const { return cp_rank_; }
  int dp_rank() const { return dp_rank_; }
  bool is_driver() const { return rank_ == plan_.driver_rank(); }
  const model::LlamaModel& model() const { return *model_; }
  const kv::KvCache& cache() const { return cache_; }
  // Written by a KV transfer into blocks the scheduler allocated (docs/pd.md).
  kv::KvCache& mutable_cache() { return cache_; }
  Groups& groups() { return groups_; }
  RankReport Report() const;
  // MoE: rows routed to each expert in this rank's layers, every step so far
  // (RankReport::expert_rows_total); empty for a dense model.
  const std::vector<int64_t>& expert_rows_total() const { return expert_rows_total_; }

  // Expert parallelism: holds the experts `placement` gives this rank from now on
  // (model::LlamaModel::SetExpertPlacement), between steps; every rank of an EP
  // group applies the same placement before its next step (kPlacement messages
  // travel with the steps, in order). InvalidArgument for a placement the slots
  // refuse, and without expert parallelism or on a borrowed model
  // (CreateLocal).
  Status SetExpertPlacement(const parallel::ExpertPlacement& placement);

  // The world rank this rank's step messages come from (the driver for stage 0,
  // the same tp rank of the previous stage after).
  int upstream() const;
  // The world rank this stage forwards steps to (the same tp rank of the next stage).
  int downstream() const;
  // Sends a step message to world rank `to` on the ctl group.
  Status SendStep(const StepMessage& message, int to);
  // The next step message from world rank `from`, validated against this rank's
  // limits and checked to be the next in order; the time spent waiting for it
  // counts as the next step's wait. idle: waiting for work that may not come for a
  // while (a worker between requests): no deadline, though a dead sender is still
  // detected at once.
  Result<StepMessage> ReceiveStep(int from, bool idle = false);
  // Runs `message` on this rank (see the file comment). On the driver, `logits`
  // receives the gathered logits [rows, vocab].
  Status RunStep(const StepMessage& message, std::vector<float>* logits);
  // KV streaming (StepExecutor::ObserveKvLayers). The driver: every RunStep from
  // now on calls `observer` after each layer's attention with that layer of
  // `blocks` as a whole-model cache lays it out — its own share, and each other
  // rank's, received inside the step (none: empty). A worker (kKvStream): its next
  // RunStep sends the driver its share of each layer of `blocks` after the layer's
  // attention (a block id outside the cache is InvalidArgument).
  using KvLayerObserver =
      std::function<void(int32_t layer, std::span<const uint8_t* const> pieces)>;
  void StreamKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer);
  Status StreamKvLayersNextStep(std::span<const int32_t> blocks);
  std::span<const int32_t> kv_stream_blocks() const { return kv_stream_blocks_; }
  // Seconds the last finished step spent communicating on this rank.
  double last_step_comm_seconds() const { return static_cast<double>(last_comm_ns_) * 1e-9; }

  // Prefill/decode disaggregation with a sharded instance (docs/pd.md): the block
  // shape of a cache holding the whole model (this rank's dtype and block size),
  // and where `rank`'s cache sits in it (InvalidArgument under context or
  // data-parallel attention, where a rank's blocks hold other positions).
  kv::KvCacheShape WholeKvShape() const;
  Result<kv::KvShardSlice> KvSliceOf(int rank) const;
  // kKvRead / kKvWrite: this rank's blocks `blocks` sent to world rank `to` as they
  // lie in its cache, one message each, or received from `from` into them (a block
  // id outside the cache or a message of another size is InvalidArgument).
  Status SendKvBlocks(std::span<const int32_t> blocks, int to);
  Status ReceiveKvBlocks(std::span<const int32_t> blocks, int from);
  // Maps the blocks' pages now, one call a block (not page by page as they are
  // written: kv::KvCache::PrepareWrite).
  void PrepareKvBlocks(std::span<const int32_t> blocks);
  // kKvPrepare: the same on a background thread while steps go on (blocks a KV
  // transfer will write; writing them meanwhile is safe: mapping leaves present
  // pages alone). A block id outside the cache is InvalidArgument.
  Status PrepareKvBlocksAhead(std::span<const int32_t> blocks);
  // One such message: `bytes` bytes exactly.
  Status SendKvBlock(const uint8_t* data, size_t bytes, int to);
  Status ReceiveKvBlock(uint8_t* data, size_t bytes, int from);

  // At shutdown: a worker sends its Report() to the driver, which receives each
  // worker's (an oversized or malformed report is InvalidArgument).
  Status SendReport(int to);
  Result<RankReport> ReceiveReport(int from);

 private:
  StageRunner(const Partition& plan, int rank, Groups groups, ThreadPool& pool,
              const RuntimeOptions& options, const model::LlamaModel& model, kv::KvCache& cache);

  Result<StepMessage> ReceiveStepMessage(int from, bool idle);
  // Context parallelism: a step's table of group-pool block ids as this rank's
  // cache ids (-1 where another cp rank holds the block); InvalidArgument for an
  // id outside this rank's part of the pool.
  Status LocalBlocks(std::span<const int32_t> blocks, std::vector<int32_t>& local) const;
  // Data-parallel attention: the dp rank running the attention of the step's
  // sequence `index` (the range of the group pool its blocks come from);
  // InvalidArgument for a table that spans two ranks' ranges or leaves the pool.
  Result<int> AttentionRankOf(const parallel::StepSequence& sequence, size_t index) const;
  Status GatherLogits(std::vector<float>* logits);
  // Inside RunStep after layer `layer`'s attention: the worker's share of the
  // streamed blocks to the driver; the driver's observer call.
  Status StreamKvLayer(int64_t layer);
  // Data-parallel attention: every dp rank's logits rows to the driver, which puts
  // them in the step's sequence order (dp_owner_).
  Status GatherLogitsByRank(const StepMessage& message, std::vector<float>* logits);
  std::map<std::string, comm::LedgerEntry> LedgerSnapshot() const;

  class BlockMapper;  // PrepareKvBlocksAhead's thread

  Partition plan_;
  int rank_, stage_, tp_rank_, cp_rank_, dp_rank_;
  Groups groups_;
  ThreadPool& pool_;
  RuntimeOptions options_;
  parallel::StepLimits limits_;
  std::unique_ptr<model::LlamaModel> owned_model_;  // Create(); CreateLocal borrows
  const model::GgufFile* file_ = nullptr;           // Create(): the file owned_model_ binds
  std::unique_ptr<kv::KvCache> owned_cache_;
  const model::LlamaModel* model_;
  kv::KvCache& cache_;
  std::vector<model::KvLayerView> kv_layers_;
  std::vector<std::vector<int32_t>>
      local_tables_;                // cp, dp > 1: the step's tables, this rank's ids
  std::vector<int32_t> dp_owner_;   // dp > 1: the dp rank of each of the step's sequences
  std::vector<int32_t> dp_tokens_;  // dp > 1: this rank's sequences' new tokens
  std::unique_ptr<TpAllReduce> tp_all_reduce_;  // tp > 1
  model::LlamaScratch scratch_;
  std::vector<float> head_logits_;  // this rank's vocab rows
  std::vector<float> gathered_;     // the driver's [tp, rows, vocab_block]
  std::vector<uint8_t> header_buf_, payload_buf_;
  uint64_t expected_step_id_ = 0;
  bool record_traffic_ = false;
  // KV streaming: the blocks, the driver's observer, the slices of every rank
  // (one layer each), and the layer's pieces as they are assembled.
  std::vector<int32_t> kv_stream_blocks_;
  KvLayerObserver kv_layer_observer_;
  std::function<Status(int64_t layer)> kv_layer_hook_ = [this](int64_t layer) {
    return StreamKvLayer(layer);
  };
  std::vector<kv::KvShardSlice> kv_layer_slices_;
  std::vector<uint8_t> kv_layer_whole_, kv_layer_share_;
  std::vector<const uint8_t*> kv_layer_pieces_;
  TimeShare decode_, prefill_;
  int64_t comm_ns_ = 0;          // the current step's sends and gathers (all-reduces: TpAllReduce)
  int64_t pending_wait_ns_ = 0;  // waiting for the current step's message
  int64_t last_comm_ns_ = 0;     // the last finished step's communication
  std::vector<StepTraffic> traffic_;
  std::vector<int64_t> expert_rows_total_;     // MoE: rows each expert ran here, every step
  std::vector<int64_t> expert_rows_by_layer_;  // EP: the same by layer [layers, experts]
  std::unique_ptr<BlockMapper> mapper_;        // started at the first PrepareKvBlocksAhead
  int64_t expert_rows_computed_ = 0;           // EP: rows this rank's experts computed, every step
};

}  // namespace tessera::engine
