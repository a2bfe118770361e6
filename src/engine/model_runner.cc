#include "engine/model_runner.h"

#include <cstdint>

#include "base/check.h"

namespace tessera::engine {

Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, kernels::KvType type,
                                  int32_t block_size, int64_t kv_capacity_tokens) {
  const model::ModelConfig& config = model.local_config();
  const int64_t context = kv_capacity_tokens > 0 ? kv_capacity_tokens : config.context_length;
  kv::KvCacheShape shape{.num_layers = static_cast<int32_t>(config.num_layers),
                         .num_kv_heads = static_cast<int32_t>(config.num_kv_heads),
                         .head_dim = static_cast<int32_t>(config.head_dim),
                         .block_size = block_size,
                         .type = type};
  TESSERA_RETURN_IF_ERROR(kv::ValidateKvCacheShape(shape));
  const int64_t num_blocks = kv::BlocksForTokens(context, block_size);
  if (num_blocks > INT32_MAX) return InvalidArgumentError("KV context too large");
  return kv::KvCache::Create(shape, static_cast<int32_t>(num_blocks));
}

ModelRunner::ModelRunner(const model::LlamaModel& model, kv::KvCache& cache, ThreadPool& pool)
    : model_(model), cache_(cache), pool_(pool) {
  const model::ModelConfig& config = model.local_config();
  const kv::KvCacheShape& shape = cache.shape();
  TESSERA_CHECK_EQ(shape.num_layers, config.num_layers);
  TESSERA_CHECK_EQ(shape.num_kv_heads, config.num_kv_heads);
  TESSERA_CHECK_EQ(shape.head_dim, config.head_dim);
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    kv_layers_.push_back({cache.k_pool(l), cache.v_pool(l)});
  }
}

Status ModelRunner::Submit(std::span<const StepEntry> entries, bool all_logits) {
  if (has_pending_) return InvalidArgumentError("Submit while a step is still to be collected");
  has_pending_ = true;
  tokens_.clear();
  sequences_.clear();
  for (const StepEntry& entry : entries) {
    TESSERA_CHECK(entry.block_table != nullptr);
    tokens_.insert(tokens_.end(), entry.new_tokens.begin(), entry.new_tokens.end());
    sequences_.push_back({.num_tokens = static_cast<int64_t>(entry.new_tokens.size()),
                          .start_position = entry.start_position,
                          .block_table = entry.block_table->blocks()});
    cache_.PrepareWrite(entry.block_table->blocks(), entry.start_position,
                        static_cast<int64_t>(entry.new_tokens.size()));
  }
  model::ForwardBatch batch{.tokens = tokens_, .sequences = sequences_, .all_logits = all_logits};
  model::KvView kv{
      .layers = kv_layers_, .layout = cache_.shape().layout(), .num_blocks = cache_.num_blocks()};
  pending_ = model_.Forward(batch, kv, scratch_, pool_, logits_);
  return Status::Ok();
}

Result<std::span<const float>> ModelRunner::Collect() {
  if (!has_pending_) return InvalidArgumentError("Collect without a submitted step");
  has_pending_ = false;
  TESSERA_RETURN_IF_ERROR(pending_);
  return std::span<const float>(logits_);
}

}  // namespace tessera::engine
