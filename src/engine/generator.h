// Generator: the simple single-rank generation loop — prefill a prompt in chunks,
// then decode token by token, sampling each with the request's sampler — over
// its own paged KV cache. Layer: engine; used by `tessera generate` and
// `tessera bench model` (the continuous-batching scheduler comes later and drives
// the same ModelRunner). Not thread-safe: one request at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model_runner.h"
#include "kernels/attention.h"
#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "model/llama.h"
#include "model/sampler.h"

namespace tessera::engine {

struct GeneratorOptions {
  kernels::KvType kv_type = kernels::KvType::kF16;
  int32_t block_size = 16;             // tokens per KV block
  int64_t max_context_tokens = 0;      // KV capacity; 0 = the model's context length
  int64_t prefill_chunk_tokens = 512;  // prompt tokens per prefill step
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included if wanted
  int64_t max_new_tokens = 0;
  model::SamplingParams sampling;
  // Called with each generated token; returning false stops (EOS, stop strings).
  std::function<bool(int32_t)> on_token;
  // Called with the [vocab] logits each generated token was sampled from.
  std::function<void(std::span<const float>)> on_logits;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // all prefill steps (the prompt's forward passes)
  double ttft_seconds = 0;     // request start to the first token sampled
  double decode_seconds = 0;   // first token to the last one (the decode steps)

  double prefill_tokens_per_s() const {
    return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
  }
  // Decode throughput over the tokens after the first (which prefill produced).
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? (generated_tokens - 1) / decode_seconds : 0;
  }
};

class Generator {
 public:
  // `model` and `pool` must outlive the generator. Allocates the KV cache
  // (InvalidArgument / ResourceExhausted on bad options).
  static Result<std::unique_ptr<Generator>> Create(const model::LlamaModel& model, ThreadPool& pool,
                                                   const GeneratorOptions& options);

  // Generates up to max_new_tokens after the prompt. InvalidArgument for an empty
  // prompt or bad sampling parameters; ResourceExhausted when prompt + tokens
  // exceed the KV capacity (checked before any work).
  Result<GenerationStats> Generate(const GenerateRequest& request);

  const GeneratorOptions& options() const { return options_; }
  const kv::KvCache& cache() const { return cache_; }
  int64_t capacity_tokens() const { return cache_.num_slots(); }

 private:
  Generator(const model::LlamaModel& model, ThreadPool& pool, const GeneratorOptions& options,
            kv::KvCache cache);

  GeneratorOptions options_;
  kv::KvCache cache_;
  kv::BlockAllocator allocator_;
  ModelRunner runner_;
  int64_t next_sequence_id_ = 0;
};

}  // namespace tessera::engine
