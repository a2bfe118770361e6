#include "engine/generator.h"

#include <algorithm>
#include <string>

#include "base/clock.h"
#include "engine/sequence.h"

namespace tessera::engine {
namespace {

double SecondsSince(int64_t start_ns) { return static_cast<double>(NowNs() - start_ns) * 1e-9; }

}  // namespace

Result<std::unique_ptr<Generator>> Generator::Create(const model::LlamaModel& model,
                                                     ThreadPool& pool,
                                                     const GeneratorOptions& options) {
  const model::ModelConfig& config = model.config();
  if (options.prefill_chunk_tokens <= 0) {
    return InvalidArgumentError("prefill chunk must be at least 1 token");
  }
  const int64_t context =
      options.max_context_tokens > 0 ? options.max_context_tokens : config.context_length;
  kv::KvCacheShape shape{.num_layers = static_cast<int32_t>(config.num_layers),
                         .num_kv_heads = static_cast<int32_t>(config.num_kv_heads),
                         .head_dim = static_cast<int32_t>(config.head_dim),
                         .block_size = options.block_size,
                         .type = options.kv_type};
  TESSERA_RETURN_IF_ERROR(kv::ValidateKvCacheShape(shape));
  const int64_t num_blocks = kv::BlocksForTokens(context, options.block_size);
  if (num_blocks > INT32_MAX) return InvalidArgumentError("KV context too large");
  TESSERA_ASSIGN_OR_RETURN(kv::KvCache cache,
                           kv::KvCache::Create(shape, static_cast<int32_t>(num_blocks)));
  return std::unique_ptr<Generator>(new Generator(model, pool, options, std::move(cache)));
}

Generator::Generator(const model::LlamaModel& model, ThreadPool& pool,
                     const GeneratorOptions& options, kv::KvCache cache)
    : options_(options),
      cache_(std::move(cache)),
      allocator_(cache_.num_blocks()),
      runner_(model, cache_, pool) {}

Result<GenerationStats> Generator::Generate(const GenerateRequest& request) {
  if (request.prompt.empty()) return InvalidArgumentError("the prompt has no tokens");
  if (request.max_new_tokens < 0) return InvalidArgumentError("negative number of tokens");
  TESSERA_RETURN_IF_ERROR(model::ValidateSamplingParams(request.sampling));
  const int64_t vocab = runner_.vocab_size();
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= vocab) {
      return InvalidArgumentError("prompt token " + std::to_string(token) +
                                  " is outside the vocabulary of " + std::to_string(vocab));
    }
  }
  // The last generated token is never fed back, so the cache holds at most
  // prompt + max_new_tokens - 1 tokens.
  const int64_t needed = static_cast<int64_t>(request.prompt.size()) +
                         std::max<int64_t>(request.max_new_tokens - 1, 0);
  if (needed > capacity_tokens()) {
    return ResourceExhaustedError("prompt of " + std::to_string(request.prompt.size()) +
                                  " tokens + " + std::to_string(request.max_new_tokens) +
                                  " new tokens exceed the KV cache of " +
                                  std::to_string(capacity_tokens()) + " tokens");
  }

  GenerationStats stats;
  stats.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  Sequence seq(next_sequence_id_++, request.prompt, request.sampling, options_.block_size);
  const int64_t start_ns = NowNs();
  int64_t first_token_ns = 0;
  Status status = Status::Ok();
  while (stats.generated_tokens < request.max_new_tokens) {
    // Feed every uncached token: the prompt in chunks, then one token per step.
    const int64_t step_start_ns = NowNs();
    const int64_t begin = seq.num_cached_tokens();
    const int64_t count = std::min(seq.num_uncached_tokens(), options_.prefill_chunk_tokens);
    status = seq.block_table().Reserve(allocator_, begin + count);
    if (!status.ok()) break;
    StepEntry entry{
        .new_tokens = seq.tokens().subspan(static_cast<size_t>(begin), static_cast<size_t>(count)),
        .start_position = begin,
        .block_table = &seq.block_table()};
    Result<std::span<const float>> logits = runner_.Step(std::span<const StepEntry>(&entry, 1));
    if (!logits.ok()) {
      status = logits.status();
      break;
    }
    seq.MarkCached(count);
    if (begin < stats.prompt_tokens) stats.prefill_seconds += SecondsSince(step_start_ns);
    if (seq.num_uncached_tokens() > 0) continue;  // more prompt chunks to go

    const int32_t token = seq.sampler().Sample(*logits, seq.tokens());
    if (request.on_logits) request.on_logits(*logits);
    seq.AppendToken(token);
    ++stats.generated_tokens;
    if (first_token_ns == 0) {
      first_token_ns = NowNs();
      stats.ttft_seconds = static_cast<double>(first_token_ns - start_ns) * 1e-9;
    }
    if (request.on_token && !request.on_token(token)) break;
  }
  if (first_token_ns != 0) stats.decode_seconds = SecondsSince(first_token_ns);
  seq.block_table().Release(allocator_);
  if (!status.ok()) return status;
  return stats;
}

}  // namespace tessera::engine
