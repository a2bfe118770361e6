#include "engine/generator.h"

#include <algorithm>
#include <deque>
#include <string>

#include "base/clock.h"
#include "engine/sequence.h"

namespace tessera::engine {
namespace {

double Seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// One request in flight.
struct Active {
  std::unique_ptr<Sequence> seq;
  const GenerateRequest* request = nullptr;
  GenerationStats stats;
  int64_t submitted_ns = 0;    // its first step's submission
  int64_t first_token_ns = 0;  // 0 until the first token
  bool done = false;
};

// A submitted step: which requests it carries and how many new tokens each.
struct InFlight {
  size_t micro_batch = 0;
  std::vector<size_t> members;
  std::vector<int64_t> counts;
};

}  // namespace

Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, const GeneratorOptions& options) {
  const model::ModelConfig& config = model.local_config();
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
  return kv::KvCache::Create(shape, static_cast<int32_t>(num_blocks));
}

Result<std::unique_ptr<Generator>> Generator::Create(const model::LlamaModel& model,
                                                     ThreadPool& pool,
                                                     const GeneratorOptions& options) {
  if (options.prefill_chunk_tokens <= 0) {
    return InvalidArgumentError("prefill chunk must be at least 1 token");
  }
  TESSERA_ASSIGN_OR_RETURN(kv::KvCache cache, CreateKvCache(model, options));
  auto owned_cache = std::make_unique<kv::KvCache>(std::move(cache));
  auto runner = std::make_unique<ModelRunner>(model, *owned_cache, pool);
  return std::unique_ptr<Generator>(
      new Generator(std::move(owned_cache), std::move(runner), options));
}

Generator::Generator(StepExecutor& executor, const GeneratorOptions& options)
    : executor_(executor), options_(options), allocator_(executor.num_kv_blocks()) {
  TESSERA_CHECK_GT(options_.prefill_chunk_tokens, 0);
  options_.block_size = executor.kv_block_size();
}

Generator::Generator(std::unique_ptr<kv::KvCache> cache, std::unique_ptr<ModelRunner> runner,
                     const GeneratorOptions& options)
    : owned_cache_(std::move(cache)),
      owned_runner_(std::move(runner)),
      executor_(*owned_runner_),
      options_(options),
      allocator_(executor_.num_kv_blocks()) {}

Status Generator::CheckRequests(std::span<const GenerateRequest> requests) const {
  const int64_t vocab = executor_.vocab_size();
  int64_t blocks = 0;
  for (const GenerateRequest& request : requests) {
    if (request.prompt.empty()) return InvalidArgumentError("the prompt has no tokens");
    if (request.max_new_tokens < 0) return InvalidArgumentError("negative number of tokens");
    TESSERA_RETURN_IF_ERROR(model::ValidateSamplingParams(request.sampling));
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
    blocks += kv::BlocksForTokens(needed, executor_.kv_block_size());
  }
  if (blocks > executor_.num_kv_blocks()) {
    return ResourceExhaustedError(std::to_string(requests.size()) + " requests need " +
                                  std::to_string(blocks) + " KV blocks together, the cache has " +
                                  std::to_string(executor_.num_kv_blocks()));
  }
  return Status::Ok();
}

Result<GenerationStats> Generator::Generate(const GenerateRequest& request) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<GenerationStats> stats,
                           GenerateBatch(std::span<const GenerateRequest>(&request, 1)));
  return stats[0];
}

Result<std::vector<GenerationStats>> Generator::GenerateBatch(
    std::span<const GenerateRequest> requests) {
  TESSERA_RETURN_IF_ERROR(CheckRequests(requests));
  const int64_t start_ns = NowNs();
  std::vector<Active> active(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    active[i].request = &requests[i];
    active[i].seq = std::make_unique<Sequence>(next_sequence_id_++, requests[i].prompt,
                                               requests[i].sampling, executor_.kv_block_size());
    active[i].stats.prompt_tokens = static_cast<int64_t>(requests[i].prompt.size());
    active[i].done = requests[i].max_new_tokens == 0;
  }
  const size_t num_micro_batches =
      std::min(requests.size(), static_cast<size_t>(std::max(executor_.max_in_flight(), 1)));

  std::deque<InFlight> in_flight;
  std::vector<StepEntry> entries;
  // The steady window: from the moment every sequence has its first token until the
  // first one finishes, and the tokens sampled in it.
  size_t first_tokens = 0;
  int64_t all_decoding_ns = 0, first_done_ns = 0, window_tokens = 0;
  // Submits micro-batch `mb`'s next step (nothing when all its requests are done).
  auto submit = [&](size_t mb) -> Status {
    InFlight step{.micro_batch = mb};
    entries.clear();
    for (size_t i = mb; i < active.size(); i += num_micro_batches) {
      Active& a = active[i];
      if (a.done) continue;
      Sequence& seq = *a.seq;
      const int64_t begin = seq.num_cached_tokens();
      const int64_t count = std::min(seq.num_uncached_tokens(), options_.prefill_chunk_tokens);
      TESSERA_RETURN_IF_ERROR(seq.block_table().Reserve(allocator_, begin + count));
      entries.push_back({.new_tokens = seq.tokens().subspan(static_cast<size_t>(begin),
                                                            static_cast<size_t>(count)),
                         .start_position = begin,
                         .block_table = &seq.block_table()});
      step.members.push_back(i);
      step.counts.push_back(count);
      if (a.submitted_ns == 0) a.submitted_ns = NowNs();
    }
    if (entries.empty()) return Status::Ok();
    TESSERA_RETURN_IF_ERROR(executor_.Submit(entries));
    in_flight.push_back(std::move(step));
    return Status::Ok();
  };
  // Consumes the oldest step's logits: samples each sequence whose prompt is done.
  auto collect = [&]() -> Status {
    InFlight step = std::move(in_flight.front());
    in_flight.pop_front();
    TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, executor_.Collect());
    const size_t vocab = static_cast<size_t>(executor_.vocab_size());
    for (size_t j = 0; j < step.members.size(); ++j) {
      Active& a = active[step.members[j]];
      Sequence& seq = *a.seq;
      seq.MarkCached(step.counts[j]);
      if (seq.num_uncached_tokens() > 0) continue;  // more prompt chunks to go
      const std::span<const float> row = logits.subspan(j * vocab, vocab);
      const int32_t token = seq.sampler().Sample(row, seq.tokens());
      if (a.request->on_logits) a.request->on_logits(row);
      seq.AppendToken(token);
      ++a.stats.generated_tokens;
      if (all_decoding_ns != 0 && first_done_ns == 0) ++window_tokens;
      if (a.first_token_ns == 0) {
        a.first_token_ns = NowNs();
        a.stats.ttft_seconds = Seconds(a.first_token_ns - start_ns);
        a.stats.prefill_seconds = Seconds(a.first_token_ns - a.submitted_ns);
        if (++first_tokens == active.size()) all_decoding_ns = a.first_token_ns;
      }
      const bool more = !a.request->on_token || a.request->on_token(token);
      if (!more || a.stats.generated_tokens >= a.request->max_new_tokens) {
        a.done = true;
        a.stats.decode_seconds = Seconds(NowNs() - a.first_token_ns);
        if (first_done_ns == 0) first_done_ns = NowNs();
        seq.block_table().Release(allocator_);
      }
    }
    return submit(step.micro_batch);
  };

  Status status = Status::Ok();
  for (size_t mb = 0; mb < num_micro_batches && status.ok(); ++mb) status = submit(mb);
  while (status.ok() && !in_flight.empty()) status = collect();
  const double window_s = all_decoding_ns != 0 && first_done_ns > all_decoding_ns
                              ? Seconds(first_done_ns - all_decoding_ns)
                              : 0;
  std::vector<GenerationStats> stats;
  for (Active& a : active) {
    if (!a.done) a.seq->block_table().Release(allocator_);
    a.stats.batch_decode_tokens_per_s =
        active.size() > 1 && window_s > 0 ? static_cast<double>(window_tokens) / window_s : 0;
    stats.push_back(a.stats);
  }
  if (!status.ok()) return status;
  return stats;
}

}  // namespace tessera::engine
