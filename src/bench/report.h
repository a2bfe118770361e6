// How `tessera bench serve` shows its results: a table laid out like vLLM's
// benchmark_serving output, and the same figures as JSON. Layer: bench; used by the
// CLI. Pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/serve_benchmark.h"

namespace tessera::bench {

// The run's settings, echoed in the report.
struct ServeRunInfo {
  std::string base_url;
  std::string endpoint;
  std::string model;
  std::string dataset;
  int64_t num_prompts = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  int64_t prefix_len = 0;
  ArrivalOptions arrivals;
  int64_t max_concurrency = 0;
  bool ignore_eos = false;
};

std::string FormatServeReport(const ServeRunInfo& info, const ServeMetrics& metrics);

// Settings, totals, throughputs, {mean, median, std, p90, p99} per latency metric
// in ms, the error list, and per-request arrays (ttfts_ms, e2els_ms, output_tokens,
// prompt_tokens, errors) as vLLM's --save-result writes them.
nlohmann::json ServeReportJson(const ServeRunInfo& info, const ServeMetrics& metrics,
                               const BenchmarkRun& run);

}  // namespace tessera::bench
