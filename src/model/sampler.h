// Sampler: picks the next token from raw logits — greedy, or temperature with
// top-k, top-p and min-p filtering, after an optional repetition penalty. Layer:
// model; the engine keeps one Sampler per sequence (its own RNG state), so a
// sequence's tokens depend only on its logits and its seed, never on the batch.
// Not thread-safe (one sequence, one caller).
//
// Order of operations (as Hugging Face transformers applies them):
//   1. repetition penalty over the distinct tokens among the last repeat_last_n
//      of `history` (CTRL rule: a positive logit is divided by the penalty, a
//      negative one multiplied);
//   2. temperature <= 0: the argmax (ties go to the lowest id, like llama.cpp);
//   3. otherwise logits / temperature, then top-k, then top-p (smallest set whose
//      probability reaches top_p), then min-p (drop p < min_p * p_max), then a draw.
// Candidates are ordered by (logit desc, id asc), a total order, so filtering is
// deterministic. Reproducibility: the RNG is std::mt19937_64 seeded with `seed`
// (its output sequence is fixed by the C++ standard) and a uniform in [0, 1) is
// formed from the top 53 bits of one output, so a seed gives the same tokens on
// every platform and standard library.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "base/status.h"

namespace tessera::model {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
  uint64_t seed = 0;

  static SamplingParams Greedy() {
    SamplingParams params;
    params.temperature = 0.0f;
    return params;
  }
};

// InvalidArgument naming the bad field (negative temperature, top_p outside
// (0, 1], penalty <= 0, …).
Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // The next token id. `logits` is [vocab] raw f32; `history` is the tokens so far
  // (prompt and generated), used by the repetition penalty only.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  void ApplyRepeatPenalty(std::span<const float> logits, std::span<const int32_t> history);
  double NextUniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> penalized_;       // [vocab], scratch
  std::vector<Candidate> candidates_;  // [vocab], scratch
  std::vector<double> probs_;          // [kept candidates], scratch
};

}  // namespace tessera::model
