#include "bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tessera::bench {
namespace {

TEST(StatsTest, EmptySampleIsAllZero) {
  MetricSummary s = Summarize({});
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.mean, 0);
  EXPECT_EQ(s.p99, 0);
}

TEST(StatsTest, SingleValue) {
  MetricSummary s = Summarize({7.5});
  EXPECT_EQ(s.count, 1u);
  EXPECT_DOUBLE_EQ(s.mean, 7.5);
  EXPECT_DOUBLE_EQ(s.median, 7.5);
  EXPECT_DOUBLE_EQ(s.p90, 7.5);
  EXPECT_DOUBLE_EQ(s.p99, 7.5);
  EXPECT_DOUBLE_EQ(s.stddev, 0);
}

// Hand-computed (numpy.percentile, linear): {1,2,3,4,10} unsorted.
// rank(p) = p/100 * 4. p50 -> 3; p90 -> rank 3.6 -> 4 + 0.6*6 = 7.6;
// p99 -> rank 3.96 -> 4 + 0.96*6 = 9.76. mean = 4. var = (9+4+1+0+36)/5 = 10.
TEST(StatsTest, HandComputedPercentiles) {
  MetricSummary s = Summarize({10, 3, 1, 4, 2});
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 4.0);
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_NEAR(s.p90, 7.6, 1e-12);
  EXPECT_NEAR(s.p99, 9.76, 1e-12);
  EXPECT_NEAR(s.stddev, std::sqrt(10.0), 1e-12);
}

// Even count: median is the midpoint of the two middle values.
TEST(StatsTest, EvenCountMedianInterpolates) {
  MetricSummary s = Summarize({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  // rank(90) = 2.7 -> 3 + 0.7 = 3.7
  EXPECT_NEAR(s.p90, 3.7, 1e-12);
}

TEST(StatsTest, PercentileEndpoints) {
  std::vector<double> sorted = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0), 0);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 100), 100);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 25), 25);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 99), 99);
}

}  // namespace
}  // namespace tessera::bench
