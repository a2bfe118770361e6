#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/check.h"
#include "kernels/ops.h"

namespace tessera::model {

Status ValidateSamplingParams(const SamplingParams& params) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
    return InvalidArgumentError("temperature must be >= 0, got " +
                                std::to_string(params.temperature));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return InvalidArgumentError("top_p must be in (0, 1], got " + std::to_string(params.top_p));
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return InvalidArgumentError("min_p must be in [0, 1], got " + std::to_string(params.min_p));
  }
  if (!(params.repeat_penalty > 0.0f) || !std::isfinite(params.repeat_penalty)) {
    return InvalidArgumentError("repeat penalty must be > 0, got " +
                                std::to_string(params.repeat_penalty));
  }
  for (float penalty : {params.presence_penalty, params.frequency_penalty}) {
    if (!(penalty >= -2.0f && penalty <= 2.0f)) {
      return InvalidArgumentError("presence and frequency penalties must be in [-2, 2], got " +
                                  std::to_string(penalty));
    }
  }
  for (const LogitBias& b : params.logit_bias) {
    if (b.token < 0) {
      return InvalidArgumentError("logit_bias names token " + std::to_string(b.token));
    }
    if (!(b.bias >= -100.0f && b.bias <= 100.0f)) {
      return InvalidArgumentError("logit_bias of token " + std::to_string(b.token) +
                                  " must be in [-100, 100], got " + std::to_string(b.bias));
    }
  }
  if (params.repeat_last_n < 0) {
    return InvalidArgumentError("repeat_last_n must be >= 0, got " +
                                std::to_string(params.repeat_last_n));
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  Status status = ValidateSamplingParams(params);
  TESSERA_CHECK(status.ok()) << status.ToString();
}

double Sampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1), 53 random bits
}

// Each distinct recent token is penalised once.
void Sampler::ApplyRepeatPenalty(std::span<const int32_t> history) {
  if (params_.repeat_penalty == 1.0f || params_.repeat_last_n == 0) return;
  const size_t n = std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
  recent_.assign(history.end() - static_cast<ptrdiff_t>(n), history.end());
  std::sort(recent_.begin(), recent_.end());
  recent_.erase(std::unique(recent_.begin(), recent_.end()), recent_.end());
  for (int32_t token : recent_) {
    if (token < 0 || static_cast<size_t>(token) >= penalized_.size()) continue;
    float& logit = penalized_[static_cast<size_t>(token)];
    logit = logit > 0.0f ? logit / params_.repeat_penalty : logit * params_.repeat_penalty;
  }
}

void Sampler::ApplyOutputPenalties(std::span<const int32_t> output) {
  if (params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f) return;
  if (output.size() < counted_) {  // the output was cut back: count it again
    output_counts_.clear();
    counted_ = 0;
  }
  for (; counted_ < output.size(); ++counted_) ++output_counts_[output[counted_]];
  for (const auto& [token, count] : output_counts_) {
    if (token < 0 || static_cast<size_t>(token) >= penalized_.size()) continue;
    penalized_[static_cast<size_t>(token)] -=
        params_.presence_penalty + static_cast<float>(count) * params_.frequency_penalty;
  }
}

bool Sampler::Prepare(std::span<const float> logits, std::span<const int32_t> history,
                      size_t num_prompt_tokens) {
  TESSERA_CHECK(!logits.empty());
  TESSERA_CHECK(num_prompt_tokens <= history.size());
  penalized_.assign(logits.begin(), logits.end());
  for (const LogitBias& b : params_.logit_bias) {
    if (static_cast<size_t>(b.token) < penalized_.size()) {
      penalized_[static_cast<size_t>(b.token)] += b.bias;
    }
  }
  ApplyRepeatPenalty(history);
  ApplyOutputPenalties(history.subspan(num_prompt_tokens));
  const int32_t vocab = static_cast<int32_t>(penalized_.size());

  if (params_.temperature <= 0.0f || params_.top_k == 1) return true;

  candidates_.resize(static_cast<size_t>(vocab));
  const float inv_temperature = 1.0f / params_.temperature;
  for (int32_t i = 0; i < vocab; ++i) {
    candidates_[static_cast<size_t>(i)] = {penalized_[static_cast<size_t>(i)] * inv_temperature, i};
  }
  auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t kept = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < kept) {
    kept = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(kept),
                      candidates_.end(), before);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), before);
  }

  // Softmax over the kept candidates (sorted, so the first is the max).
  probs_.resize(kept);
  const double max_logit = candidates_[0].logit;
  double sum = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    probs_[i] = std::exp(static_cast<double>(candidates_[i].logit) - max_logit);
    sum += probs_[i];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < kept; ++i) {
      cumulative += probs_[i] / sum;
      if (cumulative >= params_.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    // probs_[0] is the largest (exp(0) = 1 before normalisation).
    const double threshold = params_.min_p * probs_[0];
    size_t i = 1;
    while (i < kept && probs_[i] >= threshold) ++i;
    kept = i;
  }
  kept_ = kept;
  kept_sum_ = 0.0;
  for (size_t i = 0; i < kept; ++i) kept_sum_ += probs_[i];
  return false;
}

int32_t Sampler::Draw(std::span<const double> weights, double total) {
  const double target = NextUniform() * total;
  double cumulative = 0.0;
  size_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    cumulative += weights[i];
    last = i;
    if (target < cumulative) return candidates_[i].id;
  }
  return candidates_[last].id;  // rounding left target at the very end
}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                        size_t num_prompt_tokens) {
  if (Prepare(logits, history, num_prompt_tokens)) {
    return static_cast<int32_t>(kernels::Argmax(penalized_));  // first (lowest id) on ties
  }
  return Draw(std::span<const double>(probs_).first(kept_), kept_sum_);
}

int32_t Sampler::SampleWithDistribution(std::span<const float> logits,
                                        std::span<const int32_t> history, size_t num_prompt_tokens,
                                        std::span<float> q) {
  TESSERA_CHECK_EQ(q.size(), logits.size());
  std::fill(q.begin(), q.end(), 0.0f);
  if (Prepare(logits, history, num_prompt_tokens)) {
    const int32_t token = static_cast<int32_t>(kernels::Argmax(penalized_));
    q[static_cast<size_t>(token)] = 1.0f;
    return token;
  }
  for (size_t i = 0; i < kept_; ++i) {
    q[static_cast<size_t>(candidates_[i].id)] = static_cast<float>(probs_[i] / kept_sum_);
  }
  return Draw(std::span<const double>(probs_).first(kept_), kept_sum_);
}

Sampler::Verified Sampler::Verify(std::span<const float> logits, std::span<const int32_t> history,
                                  size_t num_prompt_tokens, int32_t draft,
                                  std::span<const float> draft_probs) {
  TESSERA_CHECK(draft_probs.empty() || draft_probs.size() == logits.size());
  if (Prepare(logits, history, num_prompt_tokens)) {
    const int32_t token = static_cast<int32_t>(kernels::Argmax(penalized_));
    return {token, token == draft};
  }
  // q(id): the draft's probability of `id` (one-hot at the guess when deterministic).
  auto q = [&](int32_t id) -> double {
    if (draft_probs.empty()) return id == draft ? 1.0 : 0.0;
    return static_cast<double>(draft_probs[static_cast<size_t>(id)]);
  };
  double p_draft = 0.0;
  for (size_t i = 0; i < kept_; ++i) {
    if (candidates_[i].id == draft) p_draft = probs_[i] / kept_sum_;
  }
  const double q_draft = draft >= 0 && static_cast<size_t>(draft) < logits.size() ? q(draft) : 0.0;
  const double accept = q_draft > 0.0 ? std::min(1.0, p_draft / q_draft) : 0.0;
  if (p_draft > 0.0 && NextUniform() < accept) return {draft, true};
  // Rejected: the residual max(p - q, 0), zero outside the kept candidates.
  residual_.resize(kept_);
  double total = 0.0;
  for (size_t i = 0; i < kept_; ++i) {
    residual_[i] = std::max(probs_[i] / kept_sum_ - q(candidates_[i].id), 0.0);
    total += residual_[i];
  }
  if (!(total > 0.0)) {  // p <= q everywhere, so p == q: the rejection had probability 0
    return {Draw(std::span<const double>(probs_).first(kept_), kept_sum_), false};
  }
  const int32_t token = Draw(residual_, total);
  return {token, false};
}

}  // namespace tessera::model
