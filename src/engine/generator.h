// Generator: the simple generation loop — prefill prompts in chunks, then decode
// token by token, sampling each with its request's sampler — over a StepExecutor
// (one rank's ModelRunner, or parallel::Driver across a tensor/pipeline-parallel
// plan) and the KV blocks it owns. Several requests run together as micro-batches
// that take turns through the executor, so a pipeline's stages overlap. Layer:
// engine; used by `tessera generate` and `tessera bench model` (the continuous-
// batching scheduler comes later and drives the same executors). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model_runner.h"
#include "engine/step_executor.h"
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
  // The whole batch's decode rate (every sequence's stats carry it): tokens sampled
  // once every sequence had its first token, until the first one finished, over that
  // window. A pipeline's later micro-batches still prefill while the first decode, so
  // this, not (tokens - 1) / decode_seconds, is the steady state. 0 when the window
  // is empty (one sequence, or one finished before the last began).
  double batch_decode_tokens_per_s = 0;

  double prefill_tokens_per_s() const {
    return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
  }
  // Decode throughput over the tokens after the first (which prefill produced).
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? (generated_tokens - 1) / decode_seconds : 0;
  }
};

// The KV cache `model` needs on this rank (its layers and KV heads) for
// `context_tokens` tokens; the options' context of 0 means the model's.
Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, const GeneratorOptions& options);

class Generator {
 public:
  // Over `executor` (must outlive the generator), which owns the KV storage; the
  // generator allocates its blocks.
  Generator(StepExecutor& executor, const GeneratorOptions& options);

  // A single-rank generator owning its KV cache and ModelRunner. `model` and
  // `pool` must outlive it. InvalidArgument / ResourceExhausted on bad options.
  static Result<std::unique_ptr<Generator>> Create(const model::LlamaModel& model, ThreadPool& pool,
                                                   const GeneratorOptions& options);

  // Generates up to max_new_tokens after the prompt. InvalidArgument for an empty
  // prompt or bad sampling parameters; ResourceExhausted when prompt + tokens
  // exceed the KV capacity (checked before any work).
  Result<GenerationStats> Generate(const GenerateRequest& request);

  // Runs the requests together: they are dealt round-robin into
  // min(max_in_flight, n) micro-batches; each micro-batch's step carries every
  // unfinished sequence's next tokens (a prefill chunk or one decode token), and
  // the micro-batches take turns through the executor. A sequence's tokens and
  // logits are exactly those it gets alone (batch invariance). Stats per request.
  Result<std::vector<GenerationStats>> GenerateBatch(std::span<const GenerateRequest> requests);

  const GeneratorOptions& options() const { return options_; }
  // The KV cache a generator from Create() owns (null over another executor).
  const kv::KvCache* cache() const { return owned_cache_.get(); }
  int64_t capacity_tokens() const {
    return static_cast<int64_t>(executor_.num_kv_blocks()) * executor_.kv_block_size();
  }

 private:
  Generator(std::unique_ptr<kv::KvCache> cache, std::unique_ptr<ModelRunner> runner,
            const GeneratorOptions& options);
  Status CheckRequests(std::span<const GenerateRequest> requests) const;

  std::unique_ptr<kv::KvCache> owned_cache_;   // Create() only
  std::unique_ptr<ModelRunner> owned_runner_;  // Create() only
  StepExecutor& executor_;
  GeneratorOptions options_;
  kv::BlockAllocator allocator_;
  int64_t next_sequence_id_ = 0;
};

}  // namespace tessera::engine
