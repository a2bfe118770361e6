// ModelRunner: executes one step of the model for a batch of sequences, each with
// some new tokens — prefill chunks and decode tokens mixed — against the paged KV
// cache, and returns next-token logits. Layer: engine; the generation loop (and
// later the scheduler) calls Step, one runner per rank. Not thread-safe: one
// caller; the kernels run on the runner's thread pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"
#include "model/llama.h"

namespace tessera::engine {

// One sequence's share of a step: tokens at positions [start_position,
// start_position + new_tokens.size()), whose K/V go into `block_table` (reserved
// by the caller to cover them).
struct StepEntry {
  std::span<const int32_t> new_tokens;
  int64_t start_position = 0;
  const kv::BlockTable* block_table = nullptr;
};

class ModelRunner {
 public:
  // All three must outlive the runner.
  ModelRunner(const model::LlamaModel& model, kv::KvCache& cache, ThreadPool& pool);

  // Runs the step. Returns logits [entries, vocab], row i for entry i's last new
  // token (or [total new tokens, vocab] when all_logits), valid until the next Step.
  Result<std::span<const float>> Step(std::span<const StepEntry> entries, bool all_logits = false);

  const model::LlamaModel& model() const { return model_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }
  ThreadPool& pool() { return pool_; }

 private:
  const model::LlamaModel& model_;
  kv::KvCache& cache_;
  ThreadPool& pool_;
  std::vector<model::KvLayerView> kv_layers_;  // [num_layers] pool pointers
  model::LlamaScratch scratch_;
  // Step inputs flattened for the model.
  std::vector<int32_t> tokens_;
  std::vector<model::ForwardSequence> sequences_;
  std::vector<float> logits_;
};

}  // namespace tessera::engine
