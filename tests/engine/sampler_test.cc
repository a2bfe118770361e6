#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tessera::model {
namespace {

SamplingParams Plain(float temperature, uint64_t seed) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  params.seed = seed;
  return params;
}

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<int> Histogram(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.Sample(logits, {}))];
  return counts;
}

TEST(SamplerTest, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  Sampler sampler(SamplingParams::Greedy());
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.9f}, {}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 5.0f, 5.0f, 5.0f}, {}), 1);
  SamplingParams top1 = Plain(1.0f, 3);
  top1.top_k = 1;  // top-k 1 is greedy too
  Sampler sampler_top1(top1);
  EXPECT_EQ(sampler_top1.Sample(std::vector<float>{0.0f, 2.0f, 2.0f}, {}), 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2.0f;
  auto run = [&](uint64_t seed) {
    Sampler sampler(Plain(1.0f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(sampler.Sample(logits, out));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(SamplerTest, DrawsFollowTheSoftmax) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  Sampler sampler(Plain(1.0f, 1234));
  const int draws = 40000;
  std::vector<int> counts = Histogram(sampler, LogitsOf(probs), draws);
  for (size_t i = 0; i < probs.size(); ++i) {
    const double sigma = std::sqrt(probs[i] * (1 - probs[i]) / draws);
    EXPECT_NEAR(counts[i] / static_cast<double>(draws), probs[i], 5 * sigma) << "token " << i;
  }
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = LogitsOf({0.6, 0.4});
  Sampler cold(Plain(0.25f, 5));  // p0 = 0.6^4 / (0.6^4 + 0.4^4) = 0.835
  Sampler hot(Plain(4.0f, 5));    // p0 = 0.6^.25 / (...) = 0.525
  const int draws = 20000;
  EXPECT_NEAR(Histogram(cold, logits, draws)[0] / static_cast<double>(draws), 0.835, 0.015);
  EXPECT_NEAR(Histogram(hot, logits, draws)[0] / static_cast<double>(draws), 0.525, 0.015);
}

TEST(SamplerTest, TopKKeepsOnlyTheKBest) {
  SamplingParams params = Plain(1.0f, 9);
  params.top_k = 3;
  Sampler sampler(params);
  std::vector<int> counts = Histogram(sampler, LogitsOf({0.1, 0.3, 0.05, 0.2, 0.25, 0.1}), 5000);
  std::set<size_t> drawn;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) drawn.insert(i);
  EXPECT_EQ(drawn, (std::set<size_t>{1, 3, 4}));
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  SamplingParams params = Plain(1.0f, 10);
  params.top_p = 0.65f;  // 0.4 + 0.3 = 0.7 >= 0.65: keep two
  Sampler sampler(params);
  std::vector<int> counts = Histogram(sampler, LogitsOf({0.2, 0.4, 0.1, 0.3}), 20000);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[1] / 20000.0, 0.4 / 0.7, 0.02);
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheBest) {
  SamplingParams params = Plain(1.0f, 11);
  params.min_p = 0.2f;  // threshold 0.1: 0.05 goes, 0.15 stays
  Sampler sampler(params);
  std::vector<int> counts = Histogram(sampler, LogitsOf({0.15, 0.5, 0.05, 0.3}), 5000);
  EXPECT_GT(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
}

TEST(SamplerTest, RepetitionPenaltyDemotesRecentTokens) {
  SamplingParams params = SamplingParams::Greedy();
  params.repeat_penalty = 1.5f;
  params.repeat_last_n = 2;
  Sampler sampler(params);
  const std::vector<float> logits = {2.0f, 1.6f, -1.0f, -1.2f};
  EXPECT_EQ(sampler.Sample(logits, std::vector<int32_t>{3}), 0);
  EXPECT_EQ(sampler.Sample(logits, std::vector<int32_t>{0}), 1);        // 2.0 / 1.5 < 1.6
  EXPECT_EQ(sampler.Sample(logits, std::vector<int32_t>{0, 0}), 1);     // penalised once
  EXPECT_EQ(sampler.Sample(logits, std::vector<int32_t>{0, 5, 1}), 0);  // 0 out of the window
  // Negative logits are multiplied: -1.0 * 1.5 < -1.2.
  const std::vector<float> negative = {-1.0f, -1.2f};
  EXPECT_EQ(sampler.Sample(negative, std::vector<int32_t>{0}), 1);
}

TEST(SamplerTest, RejectsBadParameters) {
  SamplingParams params;
  params.temperature = -1.0f;
  EXPECT_EQ(ValidateSamplingParams(params).code(), StatusCode::kInvalidArgument);
  params = SamplingParams();
  params.top_p = 0.0f;
  EXPECT_EQ(ValidateSamplingParams(params).code(), StatusCode::kInvalidArgument);
  params = SamplingParams();
  params.min_p = 1.5f;
  EXPECT_EQ(ValidateSamplingParams(params).code(), StatusCode::kInvalidArgument);
  params = SamplingParams();
  params.repeat_penalty = 0.0f;
  EXPECT_NE(ValidateSamplingParams(params).message().find("repeat penalty"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams()).ok());
}

TEST(SamplerTest, LogitBiasIsAddedBeforeEverythingElse) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  SamplingParams params = SamplingParams::Greedy();
  params.logit_bias = {{1, -100.0f}};  // bans the argmax
  EXPECT_EQ(Sampler(params).Sample(logits, {}), 2);
  params.logit_bias = {{3, 2.6f}, {1000, 50.0f}};  // a token past the vocabulary is ignored
  EXPECT_EQ(Sampler(params).Sample(logits, {}), 3);
  // Sampling with a temperature: a +100 bias forces the token.
  SamplingParams forced = Plain(1.0f, 9);
  forced.logit_bias = {{0, 100.0f}};
  Sampler sampler(forced);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sampler.Sample(logits, {}), 0);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  SamplingParams presence = SamplingParams::Greedy();
  presence.presence_penalty = 0.2f;
  // Token 0 in the prompt only: no penalty.
  EXPECT_EQ(Sampler(presence).Sample(logits, std::vector<int32_t>{0, 0}, 2), 0);
  // Token 0 generated once: 2.0 - 0.2 < 1.9.
  EXPECT_EQ(Sampler(presence).Sample(logits, std::vector<int32_t>{0, 0}, 1), 1);
  // A negative presence penalty favours what was generated.
  presence.presence_penalty = -0.2f;
  EXPECT_EQ(Sampler(presence).Sample(logits, std::vector<int32_t>{1}, 0), 1);

  SamplingParams frequency = SamplingParams::Greedy();
  frequency.frequency_penalty = 0.04f;
  Sampler sampler(frequency);
  // Counted incrementally as the output grows: 2 occurrences cost 0.08 (token 0
  // stays ahead), 3 cost 0.12 (token 1 wins).
  std::vector<int32_t> history = {2, 0, 0};
  EXPECT_EQ(sampler.Sample(logits, history, 1), 0);
  history.push_back(0);
  EXPECT_EQ(sampler.Sample(logits, history, 1), 1);
  // An output cut back (a rolled-back draft) is counted again from the start.
  history.resize(3);
  EXPECT_EQ(sampler.Sample(logits, history, 1), 0);
}

TEST(SamplerTest, PenaltiesAndBiasesOutOfRangeAreRefused) {
  SamplingParams params;
  params.presence_penalty = 2.5f;
  EXPECT_FALSE(ValidateSamplingParams(params).ok());
  params = {};
  params.frequency_penalty = -2.01f;
  EXPECT_FALSE(ValidateSamplingParams(params).ok());
  params = {};
  params.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(ValidateSamplingParams(params).ok());
  params.logit_bias = {{4, 100.5f}};
  EXPECT_FALSE(ValidateSamplingParams(params).ok());
  params.logit_bias = {{4, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(params).ok());
}

// Pearson's chi-square of `counts` against the distribution `p` (sums to 1).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p) {
  double n = 0;
  for (int c : counts) n += c;
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double expected = n * p[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

// The 0.999 quantile of chi-square with 5 degrees of freedom: a right rule fails
// this with probability 1e-3 (the seeds are fixed, so never here); a wrong rule
// with these sample sizes lands far above it.
constexpr double kChi2Df5Q999 = 20.52;

// Speculative verification keeps the output distribution: each token is
// distributed as Sample's — for a deterministic guess (accepted with
// probability p(guess), else a draw from p without it) and for a guess drawn
// from a draft distribution q (min(1, p/q), else max(p - q, 0)) — with
// temperature and top-k filtering in the p.
TEST(SamplerTest, VerifyKeepsTheDistributionOfSample) {
  const std::vector<double> probs = {0.35, 0.25, 0.15, 0.12, 0.08, 0.05};
  const std::vector<float> logits = LogitsOf(probs);
  constexpr int kDraws = 200000;
  for (const bool filtered : {false, true}) {
    SCOPED_TRACE(filtered ? "temperature 0.7, top-k 4" : "temperature 1");
    SamplingParams params = Plain(filtered ? 0.7f : 1.0f, 11);
    if (filtered) params.top_k = 4;
    // The target p: softmax(log probs / T) over the kept tokens.
    std::vector<double> p(probs.size(), 0.0);
    double z = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (filtered && i >= 4) continue;
      p[i] = std::pow(probs[i], 1.0 / params.temperature);
      z += p[i];
    }
    for (double& x : p) x /= z;

    // A deterministic proposer: the same guess every time (likely and unlikely).
    for (const int32_t guess : {0, 3, 5}) {
      SCOPED_TRACE("guess " + std::to_string(guess));
      Sampler sampler(params);
      std::vector<int> counts(probs.size(), 0);
      int accepted = 0;
      for (int i = 0; i < kDraws; ++i) {
        const Sampler::Verified v = sampler.Verify(logits, {}, 0, guess);
        EXPECT_EQ(v.accepted, v.token == guess);
        accepted += v.accepted ? 1 : 0;
        ++counts[static_cast<size_t>(v.token)];
      }
      EXPECT_LT(ChiSquare(counts, p), kChi2Df5Q999);
      EXPECT_NEAR(static_cast<double>(accepted) / kDraws, p[static_cast<size_t>(guess)], 0.005);
    }

    // A draft model: guesses drawn from q (its own RNG), q far from p.
    const std::vector<float> q = {0.05f, 0.10f, 0.10f, 0.15f, 0.20f, 0.40f};
    Sampler sampler(params);
    std::mt19937_64 draft_rng(99);
    std::discrete_distribution<int32_t> draft(q.begin(), q.end());
    std::vector<int> counts(probs.size(), 0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      const int32_t guess = draft(draft_rng);
      const Sampler::Verified v = sampler.Verify(logits, {}, 0, guess, q);
      accepted += v.accepted ? 1 : 0;
      ++counts[static_cast<size_t>(v.token)];
    }
    EXPECT_LT(ChiSquare(counts, p), kChi2Df5Q999);
    double overlap = 0;  // the acceptance rate: sum of min(p, q)
    for (size_t i = 0; i < p.size(); ++i) overlap += std::min(p[i], static_cast<double>(q[i]));
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, overlap, 0.005);
  }
}

// Greedy verification is the argmax, whatever the guess; the same seed repeats.
TEST(SamplerTest, VerifyIsGreedyWithoutTemperatureAndRepeatsWithASeed) {
  Sampler greedy(SamplingParams::Greedy());
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.9f};
  EXPECT_EQ(greedy.Verify(logits, {}, 0, 1).token, 1);
  EXPECT_TRUE(greedy.Verify(logits, {}, 0, 1).accepted);
  EXPECT_EQ(greedy.Verify(logits, {}, 0, 3).token, 1);
  EXPECT_FALSE(greedy.Verify(logits, {}, 0, 3).accepted);
  Sampler a(Plain(1.0f, 5)), b(Plain(1.0f, 5));
  for (int i = 0; i < 100; ++i) {
    const Sampler::Verified va = a.Verify(logits, {}, 0, i % 4);
    const Sampler::Verified vb = b.Verify(logits, {}, 0, i % 4);
    EXPECT_EQ(va.token, vb.token);
    EXPECT_EQ(va.accepted, vb.accepted);
  }
}

// SampleWithDistribution draws Sample's token (the same RNG use) and reports the
// distribution it drew from: a guess drawn with it and verified against the same
// logits is always kept (p == q), and the kept tokens follow p.
TEST(SamplerTest, SampleWithDistributionReportsWhatItDrawsFrom) {
  const std::vector<double> probs = {0.35, 0.25, 0.15, 0.12, 0.08, 0.05};
  const std::vector<float> logits = LogitsOf(probs);
  SamplingParams params = Plain(0.7f, 3);
  params.top_k = 4;
  Sampler plain(params), reporting(params);
  std::vector<float> q(probs.size());
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(reporting.SampleWithDistribution(logits, {}, 0, q), plain.Sample(logits, {}));
  }
  double z = 0, sum = 0;
  for (size_t i = 0; i < 4; ++i) z += std::pow(probs[i], 1.0 / 0.7);
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = i < 4 ? std::pow(probs[i], 1.0 / 0.7) / z : 0.0;
    EXPECT_NEAR(q[i], expected, 1e-6) << i;
    sum += q[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);

  constexpr int kDraws = 100000;
  Sampler target(params);
  SamplingParams draft_params = params;
  draft_params.seed = 8;
  Sampler drafter(draft_params);
  std::vector<int> counts(probs.size(), 0);
  int accepted = 0;
  for (int i = 0; i < kDraws; ++i) {
    const int32_t guess = drafter.SampleWithDistribution(logits, {}, 0, q);
    const Sampler::Verified v = target.Verify(logits, {}, 0, guess, q);
    accepted += v.accepted ? 1 : 0;
    ++counts[static_cast<size_t>(v.token)];
  }
  EXPECT_GE(accepted, kDraws - 5);  // p/q is 1 up to float rounding
  std::vector<double> p(probs.size(), 0.0);
  for (size_t i = 0; i < 4; ++i) p[i] = std::pow(probs[i], 1.0 / 0.7) / z;
  EXPECT_LT(ChiSquare(counts, p), kChi2Df5Q999);

  Sampler greedy(SamplingParams::Greedy());
  EXPECT_EQ(greedy.SampleWithDistribution(logits, {}, 0, q), 0);
  EXPECT_EQ(q[0], 1.0f);
  EXPECT_EQ(std::count(q.begin(), q.end(), 0.0f), 5);
}

}  // namespace
}  // namespace tessera::model
