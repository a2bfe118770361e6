#include "bench/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera::bench {
namespace {

TEST(ArrivalsTest, InfiniteRateSendsEverythingAtOnce) {
  auto offsets = ArrivalOffsetsSeconds(5, ArrivalOptions{});
  ASSERT_EQ(offsets.size(), 5u);
  for (double t : offsets) EXPECT_EQ(t, 0);
}

TEST(ArrivalsTest, FixedIntervals) {
  ArrivalOptions o{.request_rate = 4, .process = ArrivalProcess::kFixed};
  auto offsets = ArrivalOffsetsSeconds(5, o);
  ASSERT_EQ(offsets.size(), 5u);
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_NEAR(offsets[i], 0.25 * i, 1e-12);
}

// 20000 exponential gaps at 8 req/s: the mean gap's standard error is
// 0.125 / sqrt(20000) ≈ 0.00088 s, so ±3% (≈ 4 standard errors) is a safe bound.
TEST(ArrivalsTest, PoissonMeanRate) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    ArrivalOptions o{.request_rate = 8, .seed = seed};
    auto offsets = ArrivalOffsetsSeconds(20001, o);
    const double rate = 20000.0 / offsets.back();
    EXPECT_NEAR(rate, 8.0, 8.0 * 0.03) << "seed " << seed;
    // Exponential gaps: coefficient of variation ≈ 1 (fixed would be 0).
    double sum = 0, sq = 0;
    for (size_t i = 1; i < offsets.size(); ++i) {
      const double gap = offsets[i] - offsets[i - 1];
      ASSERT_GE(gap, 0);
      sum += gap;
      sq += gap * gap;
    }
    const double mean = sum / 20000, var = sq / 20000 - mean * mean;
    EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.05);
  }
}

// Burstiness changes the spread (gamma shape) but not the mean rate.
TEST(ArrivalsTest, BurstinessKeepsMeanRate) {
  ArrivalOptions o{.request_rate = 20, .burstiness = 0.25, .seed = 7};
  auto offsets = ArrivalOffsetsSeconds(40001, o);
  EXPECT_NEAR(40000.0 / offsets.back(), 20.0, 20.0 * 0.05);
}

TEST(ArrivalsTest, Deterministic) {
  ArrivalOptions o{.request_rate = 3, .seed = 42};
  EXPECT_EQ(ArrivalOffsetsSeconds(50, o), ArrivalOffsetsSeconds(50, o));
}

}  // namespace
}  // namespace tessera::bench
