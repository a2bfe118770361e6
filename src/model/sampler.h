// Sampler: picks the next token from raw logits — greedy, or temperature with
// top-k, top-p and min-p filtering, after optional logit biases and penalties. Layer:
// model; the engine keeps one Sampler per sequence (its own RNG state), so a
// sequence's tokens depend only on its logits and its seed, never on the batch.
// Not thread-safe (one sequence, one caller).
//
// Order of operations:
//   1. logit_bias: each listed token's bias is added to its logit (OpenAI's
//      logit_bias; -100 in effect bans a token, +100 forces it);
//   2. repetition penalty over the distinct tokens among the last repeat_last_n
//      of `history` (CTRL rule, as Hugging Face transformers applies it: a positive
//      logit is divided by the penalty, a negative one multiplied);
//   3. presence and frequency penalties (OpenAI's rule, over the generated tokens
//      only, as vLLM counts them): a token generated c > 0 times so far loses
//      presence_penalty + c × frequency_penalty;
//   4. temperature <= 0: the argmax (ties go to the lowest id, like llama.cpp);
//   5. otherwise logits / temperature, then top-k, then top-p (smallest set whose
//      probability reaches top_p), then min-p (drop p < min_p * p_max), then a draw.
// Candidates are ordered by (logit desc, id asc), a total order, so filtering is
// deterministic. Reproducibility: the RNG is std::mt19937_64 seeded with `seed`
// (its output sequence is fixed by the C++ standard) and a uniform in [0, 1) is
// formed from the top 53 bits of one output, so a seed gives the same tokens on
// every platform and standard library.
//
// Speculative decoding verifies a guessed token with Verify: the standard
// rejection rule (accept the guess x with probability min(1, p(x)/q(x)), else draw
// from max(p - q, 0) renormalised; q is one-hot at x for a deterministic
// proposer), so the kept token is distributed exactly as Sample's.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace tessera::model {

// A bias added to one token's logit before sampling.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;  // [-100, 100]
};

struct SamplingParams {
  float temperature = 0.8f;           // <= 0: greedy
  int32_t top_k = 40;                 // <= 0: off
  float top_p = 0.95f;                // >= 1: off
  float min_p = 0.05f;                // <= 0: off
  float repeat_penalty = 1.0f;        // 1: off
  int32_t repeat_last_n = 64;         // how many recent tokens the penalty looks at
  float presence_penalty = 0.0f;      // [-2, 2]; 0: off
  float frequency_penalty = 0.0f;     // [-2, 2]; 0: off
  std::vector<LogitBias> logit_bias;  // token ids outside the vocabulary are ignored
  uint64_t seed = 0;

  static SamplingParams Greedy() {
    SamplingParams params;
    params.temperature = 0.0f;
    return params;
  }
};

// InvalidArgument naming the bad field (negative temperature, top_p outside
// (0, 1], penalty <= 0, a presence or frequency penalty outside [-2, 2], a bias
// outside [-100, 100] or for a negative token id, …).
Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // The next token id. `logits` is [vocab] raw f32; `history` is the tokens so far
  // (prompt and generated), of which the first `num_prompt_tokens` are the prompt:
  // the repetition penalty looks at the last repeat_last_n of all of them, the
  // presence and frequency penalties at the generated ones only.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history,
                 size_t num_prompt_tokens = 0);

  // Sample's token, and in `q` ([vocab]) the distribution it was drawn from (after
  // biases, penalties, temperature and filtering; one-hot when greedy): what a
  // draft model that samples its guesses hands to Verify as draft_probs.
  int32_t SampleWithDistribution(std::span<const float> logits, std::span<const int32_t> history,
                                 size_t num_prompt_tokens, std::span<float> q);
  // Speculative verification of `draft`, a guess for the token these logits
  // predict: the token to keep, the guess itself when accepted. Greedy: the
  // argmax (accepted when it is the guess), so the output is Sample's token for
  // token. Otherwise the rejection rule over the distribution Sample draws from
  // (after biases, penalties, temperature and filtering): `draft_probs` empty (a
  // deterministic proposer): accepted with probability p(draft), else a token
  // drawn from p without the draft, renormalised; `draft_probs` the [vocab]
  // distribution q the draft was drawn from: accepted with probability
  // min(1, p/q), else drawn from max(p - q, 0) renormalised. Uses the sampler's
  // RNG (one or two uniforms), so seeded runs repeat.
  struct Verified {
    int32_t token = 0;
    bool accepted = false;
  };
  Verified Verify(std::span<const float> logits, std::span<const int32_t> history,
                  size_t num_prompt_tokens, int32_t draft, std::span<const float> draft_probs = {});

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  // Biases and penalties into penalized_; true when greedy (the answer is its
  // argmax), else the kept candidates_[0, kept_) with their unnormalised
  // probabilities probs_ (sum kept_sum_).
  bool Prepare(std::span<const float> logits, std::span<const int32_t> history,
               size_t num_prompt_tokens);
  // A draw among candidates_[0, weights.size()), candidates_[i] with weight
  // weights[i] (sum `total`).
  int32_t Draw(std::span<const double> weights, double total);
  void ApplyRepeatPenalty(std::span<const int32_t> history);
  void ApplyOutputPenalties(std::span<const int32_t> output);
  double NextUniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> penalized_;       // [vocab], scratch
  std::vector<Candidate> candidates_;  // [vocab], scratch
  std::vector<double> probs_;          // [kept candidates], scratch
  std::vector<double> residual_;       // [kept candidates], scratch (Verify)
  size_t kept_ = 0;
  double kept_sum_ = 0;
  std::vector<int32_t> recent_;  // distinct recent tokens, scratch
  // Generated-token counts for the presence and frequency penalties, kept up to
  // date incrementally: counted_ tokens of the output are in them.
  std::unordered_map<int32_t, int32_t> output_counts_;
  size_t counted_ = 0;
};

}  // namespace tessera::model
