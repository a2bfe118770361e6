#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
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

}  // namespace
}  // namespace tessera::model
