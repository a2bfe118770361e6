// ModelRunner: executes one step of a whole model on this rank for a batch of
// sequences, each with some new tokens — prefill chunks and decode tokens mixed —
// against the paged KV cache, and returns next-token logits. Layer: engine; the
// StepExecutor of single-rank runs (parallel::Driver is the one across ranks). Not
// thread-safe: one caller; the kernels run on the runner's thread pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/step_executor.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"
#include "model/llama.h"

namespace tessera::engine {

// The KV cache `model` needs on this rank (its layers and KV heads) for
// `kv_capacity_tokens` tokens (0: the model's context length), in blocks of
// `block_size` tokens. InvalidArgument on a bad shape or an oversized context.
Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, kernels::KvType type,
                                  int32_t block_size, int64_t kv_capacity_tokens);

class ModelRunner final : public StepExecutor {
 public:
  // All three must outlive the runner. The model must be whole (one rank, one stage).
  ModelRunner(const model::LlamaModel& model, kv::KvCache& cache, ThreadPool& pool);

  // StepExecutor: Submit runs the step at once; Collect returns its result.
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int32_t num_kv_blocks() const override { return cache_.num_blocks(); }
  int32_t kv_block_size() const override { return cache_.shape().block_size; }
  Status Submit(std::span<const StepEntry> entries, bool all_logits = false) override;
  Result<std::span<const float>> Collect() override;

  const model::LlamaModel& model() const { return model_; }
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
  Status pending_ = InvalidArgumentError("Collect without a submitted step");
  bool has_pending_ = false;
};

}  // namespace tessera::engine
