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
TEST(Metrics, MergesReplicasWithOneHeaderAFamilyAndTheirLabels) {
  const std::string replica0 =
      "# HELP tessera_generation_tokens_total Tokens generated\n"
      "# TYPE tessera_generation_tokens_total counter\n"
      "tessera_generation_tokens_total 12\n"
      "# HELP tessera_comm_bytes_total Bytes\n"
      "# TYPE tessera_comm_bytes_total counter\n"
      "tessera_comm_bytes_total{group=\"tp\"} 100\n"
      "# HELP tessera_ttft_seconds TTFT\n"
      "# TYPE tessera_ttft_seconds histogram\n"
      "tessera_ttft_seconds_bucket{le=\"0.1\"} 1\n"
      "tessera_ttft_seconds_bucket{le=\"+Inf\"} 2\n"
      "tessera_ttft_seconds_sum 0.3\n"
      "tessera_ttft_seconds_count 2\n";
  // Replica 1 has one family more, in another order, and a comment.
  const std::string replica1 =
      "# HELP tessera_ttft_seconds TTFT\n"
      "# TYPE tessera_ttft_seconds histogram\n"
      "tessera_ttft_seconds_bucket{le=\"0.1\"} 0\n"
      "tessera_ttft_seconds_bucket{le=\"+Inf\"} 1\n"
      "tessera_ttft_seconds_sum 0.2\n"
      "tessera_ttft_seconds_count 1\n"
      "# a comment\n"
      "# HELP tessera_pd_kv_exports_total Exports\n"
      "# TYPE tessera_pd_kv_exports_total counter\n"
      "tessera_pd_kv_exports_total{} 3\n"
      "# HELP tessera_generation_tokens_total Tokens generated\n"
      "# TYPE tessera_generation_tokens_total counter\n"
      "tessera_generation_tokens_total 30\n";
  const std::string merged = MergeReplicaMetrics({{0, replica0}, {1, replica1}});
  const std::string expected =
      "# HELP tessera_generation_tokens_total Tokens generated\n"
      "# TYPE tessera_generation_tokens_total counter\n"
      "tessera_generation_tokens_total{replica=\"0\"} 12\n"
      "tessera_generation_tokens_total{replica=\"1\"} 30\n"
      "# HELP tessera_comm_bytes_total Bytes\n"
      "# TYPE tessera_comm_bytes_total counter\n"
      "tessera_comm_bytes_total{replica=\"0\",group=\"tp\"} 100\n"
      "# HELP tessera_ttft_seconds TTFT\n"
      "# TYPE tessera_ttft_seconds histogram\n"
      "tessera_ttft_seconds_bucket{replica=\"0\",le=\"0.1\"} 1\n"
      "tessera_ttft_seconds_bucket{replica=\"0\",le=\"+Inf\"} 2\n"
      "tessera_ttft_seconds_sum{replica=\"0\"} 0.3\n"
      "tessera_ttft_seconds_count{replica=\"0\"} 2\n"
      "tessera_ttft_seconds_bucket{replica=\"1\",le=\"0.1\"} 0\n"
      "tessera_ttft_seconds_bucket{replica=\"1\",le=\"+Inf\"} 1\n"
      "tessera_ttft_seconds_sum{replica=\"1\"} 0.2\n"
      "tessera_ttft_seconds_count{replica=\"1\"} 1\n"
      "# HELP tessera_pd_kv_exports_total Exports\n"
      "# TYPE tessera_pd_kv_exports_total counter\n"
      "tessera_pd_kv_exports_total{replica=\"1\"} 3\n";
  EXPECT_EQ(merged, expected);
  EXPECT_EQ(MergeReplicaMetrics({}), "");
}

TEST(Metrics, MergingARealRenderKeepsEveryFamilyOnce) {
  Metrics metrics;
  engine::SchedulerStats stats;
  stats.generation_tokens_total = 7;
  const std::string one = metrics.Render(stats);
  const std::string merged = MergeReplicaMetrics({{0, one}, {3, one}});
  size_t helps = 0, samples = 0;
  for (size_t at = 0; (at = one.find("# HELP ", at)) != std::string::npos; ++at) ++helps;
  for (size_t at = 0; (at = merged.find("# HELP ", at)) != std::string::npos; ++at) ++samples;
  EXPECT_EQ(samples, helps);  // one header per family, not one per replica
  EXPECT_NE(merged.find("tessera_generation_tokens_total{replica=\"0\"} 7\n"), std::string::npos)
      << merged;
  EXPECT_NE(merged.find("tessera_generation_tokens_total{replica=\"3\"} 7\n"), std::string::npos)
      << merged;
}

}  // namespace tessera::serve
