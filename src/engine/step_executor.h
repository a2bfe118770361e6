// StepExecutor: what runs model steps for the generation loop (the scheduler) —
// the Driver (driver.h) over one rank or the ranks of a tensor/pipeline-parallel
// plan; tests wrap it to record or delay steps. Steps may be pipelined: up to max_in_flight()
// submitted steps are outstanding at once (a pipeline's stages work on different
// micro-batches); Collect() returns the oldest one's logits. Layer: engine. Not
// thread-safe: one caller.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "base/status.h"
#include "kv/block_allocator.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"

namespace tessera::engine {

// One sequence's share of a step: tokens at positions [start_position,
// start_position + new_tokens.size()), whose K/V go into `block_table` (reserved
// by the caller to cover them).
struct StepEntry {
  std::span<const int32_t> new_tokens;
  int64_t start_position = 0;
  const kv::BlockTable* block_table = nullptr;
  // Logits of every new token instead of the last one only (speculative
  // verification needs each position's; a prefill chunk needs none but its last).
  bool all_logits = false;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;

  virtual int64_t vocab_size() const = 0;
  // The KV cache every rank holds: blocks (ids [0, num_kv_blocks)) of kv_block_size tokens.
  virtual int32_t num_kv_blocks() const = 0;
  virtual int32_t kv_block_size() const = 0;
  int64_t capacity_tokens() const { return int64_t{num_kv_blocks()} * kv_block_size(); }
  // Context parallelism: the block ids form kv_partitions() equal ranges, one per cp
  // rank's cache, and a table's block at index j must come from kv_placement()(j).
  virtual int32_t kv_partitions() const { return 1; }
  virtual kv::BlockPlacement kv_placement() const { return {}; }
  // Data-parallel attention (--dp N --ep N on an MoE model): the block ids form
  // attention_ranks() equal ranges, one per DP rank's cache, and every block of one
  // sequence comes from one range — the rank that runs that sequence's attention,
  // which the scheduler picks when it admits the sequence. 1: one range.
  virtual int32_t attention_ranks() const { return 1; }
  // The tokens one sequence's KV can hold: its attention rank's share of the pool.
  int64_t sequence_capacity_tokens() const { return capacity_tokens() / attention_ranks(); }
  // What a cached KV block's contents depend on besides its tokens (model shape,
  // KV dtype, block size): the prefix cache's hash chains start from it.
  virtual std::string kv_cache_salt() const { return "tessera"; }
  // Steps that may be outstanding at once (1: Submit then Collect, in turn).
  virtual int max_in_flight() const { return 1; }

  // Starts a step; the entries (tokens, block tables) are read before it returns.
  // all_logits: logits of every new token of every entry (as if each entry's
  // StepEntry::all_logits were set).
  virtual Status Submit(std::span<const StepEntry> entries, bool all_logits = false) = 0;
  // Finishes the oldest submitted step: its logits, entry after entry, one [vocab]
  // row per new token of an entry with all_logits (or of every entry when the
  // step's all_logits), one for its last new token otherwise; valid until the next
  // Submit or Collect.
  virtual Result<std::span<const float>> Collect() = 0;
  // Seconds the last collected step spent communicating on this rank (0 on one rank).
  virtual double last_step_comm_seconds() const { return 0; }

  // Prefill/decode disaggregation across layouts (docs/pd.md): KV blocks as a
  // cache holding the whole model lays them out (whole_kv_shape(): every layer and
  // KV head, in the cache's dtype), read from and written into every rank's share
  // of them. Only between steps (nothing in flight); the blocks' bytes are
  // blocks.size() × whole_kv_shape().BytesPerBlock(). Refused by default.
  virtual Result<kv::KvCacheShape> whole_kv_shape() const {
    return InvalidArgumentError("this executor does not move KV blocks");
  }
  virtual Status ReadKvBlocks(std::span<const int32_t> blocks, uint8_t* out) {
    (void)blocks, (void)out;
    return InvalidArgumentError("this executor does not move KV blocks");
  }
  virtual Status WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) {
    (void)blocks, (void)in;
    return InvalidArgumentError("this executor does not move KV blocks");
  }
  // A hint: a KV transfer will soon write these blocks; map their memory now, in
  // the background (the cache is committed lazily, and mapping costs ~3 ms a
  // MiB on a VM). Nothing by default.
  virtual Status PrepareKvBlocks(std::span<const int32_t> blocks) {
    (void)blocks;
    return Status::Ok();
  }

  // KV streaming between instances (docs/pd.md): `observer` is called inside
  // every later Submit (on this thread) after each layer's attention, layers in
  // order, with that layer's K and V of each of `blocks` (ids in this cache, whose
  // K/V the step completes) as a cache of the whole model lays it out —
  // whole_kv_shape().BytesPerBlock() / layers bytes a block, valid during the
  // call — so that a transfer can send it while the later layers compute; true
  // then. An empty observer stops it. False (the default): not here (the step's
  // layers do not run in Submit: a pipeline, or a rank's blocks hold other
  // positions).
  using KvLayerObserver =
      std::function<void(int32_t layer, std::span<const uint8_t* const> pieces)>;
  virtual bool ObserveKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer) {
    (void)blocks, (void)observer;
    return false;
  }

  // Submit then Collect (when nothing else is in flight).
  Result<std::span<const float>> Step(std::span<const StepEntry> entries, bool all_logits = false) {
    TESSERA_RETURN_IF_ERROR(Submit(entries, all_logits));
    return Collect();
  }
};

}  // namespace tessera::engine
