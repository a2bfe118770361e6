// Sequence: one request's state in the engine — its tokens (prompt, then
// generated), how many of them have K/V in the cache, its KV block table and its
// sampler (own RNG). Layer: engine; the generation loop / scheduler owns sequences,
// the runner reads their block tables. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "kv/block_table.h"
#include "model/sampler.h"

namespace tessera::engine {

class Sequence {
 public:
  Sequence(int64_t id, std::vector<int32_t> prompt, const model::SamplingParams& sampling,
           int32_t block_size)
      : id_(id),
        tokens_(std::move(prompt)),
        num_prompt_tokens_(static_cast<int64_t>(tokens_.size())),
        block_table_(block_size),
        sampler_(sampling) {}

  int64_t id() const { return id_; }
  std::span<const int32_t> tokens() const { return tokens_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int64_t num_generated_tokens() const { return num_tokens() - num_prompt_tokens_; }
  // Tokens whose K/V are in the cache; the rest still have to be computed.
  int64_t num_cached_tokens() const { return num_cached_tokens_; }
  int64_t num_uncached_tokens() const { return num_tokens() - num_cached_tokens_; }

  void AppendToken(int32_t token) { tokens_.push_back(token); }
  void MarkCached(int64_t num_tokens) {
    TESSERA_CHECK(num_tokens >= 0 && num_cached_tokens_ + num_tokens <= this->num_tokens());
    num_cached_tokens_ += num_tokens;
  }
  // After its blocks were released (preemption): every token, prompt and
  // generated, is computed again; the sampler's state is kept.
  void ForgetCached() { num_cached_tokens_ = 0; }

  kv::BlockTable& block_table() { return block_table_; }
  const kv::BlockTable& block_table() const { return block_table_; }
  model::Sampler& sampler() { return sampler_; }

 private:
  int64_t id_;
  std::vector<int32_t> tokens_;
  int64_t num_prompt_tokens_;
  int64_t num_cached_tokens_ = 0;
  kv::BlockTable block_table_;
  model::Sampler sampler_;
};

}  // namespace tessera::engine
