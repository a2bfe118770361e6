// Metrics: histogram buckets are cumulative and the exposition names every series.
#include "serve/metrics.h"

#include <gtest/gtest.h>

namespace tessera::serve {
namespace {

TEST(Metrics, HistogramIsCumulative) {
  Histogram h({1, 2});
  h.Observe(0.5);
  h.Observe(1.5);
  h.Observe(5);
  std::string out;
  h.Render("x", "help", &out);
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"2\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_sum 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 3\n"), std::string::npos) << out;
}

TEST(Metrics, RendersStatsRequestsAndComm) {
  Metrics metrics;
  metrics.ObserveRequest("completions", "length", 0.01, 0.002, 0.1);
  metrics.CountHttpError(429);
  CommTotals comm;
  comm.by_group["tp"].bytes_sent = 1234;
  comm.comm_seconds = 0.5;
  metrics.SetComm(comm);
  engine::SchedulerStats stats;
  stats.running = 2;
  stats.kv_blocks_used = 1;
  stats.kv_blocks_total = 4;
  const std::string out = metrics.Render(stats);
  EXPECT_NE(out.find("tessera_num_requests_running 2\n"), std::string::npos);
  EXPECT_NE(out.find("tessera_kv_cache_usage_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(out.find("tessera_requests_total{endpoint=\"completions\",finish_reason=\"length\"} 1"),
            std::string::npos);
  EXPECT_NE(out.find("tessera_http_errors_total{status=\"429\"} 1"), std::string::npos);
  EXPECT_NE(out.find("tessera_comm_bytes_sent_total{group=\"tp\"} 1234"), std::string::npos);
  EXPECT_NE(out.find("tessera_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_EQ(out.find("tessera_expert_rows_total"), std::string::npos);  // dense: none
}

TEST(Metrics, RendersExpertLoadUnderExpertParallelism) {
  Metrics metrics;
  CommTotals comm;
  comm.expert_rows = {5, 1, 2, 7};  // 4 experts over ep 2: {0, 1} on rank 0, {2, 3} on 1
  comm.ep = 2;
  comm.expert_home = {0, 0, 1, 1};
  metrics.SetComm(comm);
  const std::string out = metrics.Render(engine::SchedulerStats{});
  EXPECT_NE(out.find("tessera_expert_rows_total{expert=\"3\",ep_rank=\"1\"} 7\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("tessera_ep_rank_rows_total{ep_rank=\"0\"} 6\n"), std::string::npos);
  EXPECT_NE(out.find("tessera_ep_rank_rows_total{ep_rank=\"1\"} 9\n"), std::string::npos);
}

}  // namespace
}  // namespace tessera::serve
