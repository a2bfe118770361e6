// The --request-rates parser (bad lists refused) and the sweep summary table.
#include "bench/sweep.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera::bench {
namespace {

TEST(SweepTest, ParsesRatesInOrder) {
  auto rates = ParseRequestRates("1,2.5, 4 ,inf,0.5");
  ASSERT_TRUE(rates.ok()) << rates.status().ToString();
  ASSERT_EQ(rates->size(), 5u);
  EXPECT_EQ((*rates)[0], 1.0);
  EXPECT_EQ((*rates)[1], 2.5);
  EXPECT_EQ((*rates)[2], 4.0);
  EXPECT_TRUE(std::isinf((*rates)[3]));
  EXPECT_EQ((*rates)[4], 0.5);
  auto one = ParseRequestRates("inf");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
}

TEST(SweepTest, RefusesBadLists) {
  for (const char* bad : {"", " ", ",", "1,", ",1", "1,,2", "0", "-1", "1,-2", "abc", "1x", "2,nan",
                          "1e999", "Inf", "1,1", "inf,inf", "4;8", "1 2"}) {
    auto rates = ParseRequestRates(bad);
    EXPECT_FALSE(rates.ok()) << "'" << bad << "' was accepted";
    if (!rates.ok()) {
      EXPECT_EQ(rates.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(rates.status().message().find("--request-rates"), std::string::npos) << bad;
    }
  }
}

TEST(SweepTest, RateLabel) {
  EXPECT_EQ(RateLabel(4), "4");
  EXPECT_EQ(RateLabel(0.5), "0.5");
  EXPECT_EQ(RateLabel(INFINITY), "inf");
}

TEST(SweepTest, SummaryHasOneRowPerRate) {
  std::vector<SweepPoint> points(2);
  points[0].request_rate = 2;
  points[0].metrics.completed = 10;
  points[0].metrics.request_throughput = 1.98;
  points[0].metrics.output_throughput = 253.44;
  points[0].metrics.ttft_ms.median = 61.5;
  points[0].metrics.ttft_ms.p99 = 80.25;
  points[0].metrics.tpot_ms.median = 20.5;
  points[0].metrics.tpot_ms.p99 = 22.75;
  points[0].metrics.e2el_ms.median = 141;
  points[0].metrics.e2el_ms.p99 = 160;
  points[1].request_rate = INFINITY;
  points[1].metrics.completed = 8;
  points[1].metrics.failed = 2;
  const std::string table = FormatSweepSummary(points);
  EXPECT_NE(table.find("TTFT p50"), std::string::npos) << table;
  EXPECT_NE(table.find("E2EL p99"), std::string::npos) << table;
  EXPECT_NE(table.find("2      10/10     1.98     253.44     61.50     80.25    20.50    22.75"
                       "    141.00    160.00\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("\ninf     8/10"), std::string::npos) << table;
}

}  // namespace
}  // namespace tessera::bench
