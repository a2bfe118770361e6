#include "bench/report.h"

#include <cmath>
#include <cstdio>

namespace tessera::bench {
namespace {

constexpr int kWidth = 50;

std::string Rule(const std::string& title, char fill) {
  const int pad = kWidth - static_cast<int>(title.size());
  const int left = pad > 0 ? pad / 2 : 0;
  const int right = pad > 0 ? pad - left : 0;
  return std::string(static_cast<size_t>(left), fill) + title +
         std::string(static_cast<size_t>(right), fill) + "\n";
}

std::string Row(const std::string& label, const std::string& value) {
  char line[160];
  std::snprintf(line, sizeof line, "%-40s %-10s\n", label.c_str(), value.c_str());
  return line;
}

std::string Num(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string Rate(const ArrivalOptions& a) {
  if (std::isinf(a.request_rate)) return "inf";
  std::string out = Num(a.request_rate) + " req/s, ";
  if (a.process == ArrivalProcess::kFixed) return out + "fixed interval";
  return out +
         (a.burstiness == 1.0 ? std::string("poisson") : "gamma, burstiness " + Num(a.burstiness));
}

std::string Section(const std::string& title, const std::string& abbrev, const MetricSummary& s) {
  std::string out = Rule(title, '-');
  out += Row("Mean " + abbrev + " (ms):", Num(s.mean));
  out += Row("Median " + abbrev + " (ms):", Num(s.median));
  out += Row("P90 " + abbrev + " (ms):", Num(s.p90));
  out += Row("P99 " + abbrev + " (ms):", Num(s.p99));
  return out;
}

nlohmann::json SummaryJson(const MetricSummary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median},
          {"std", s.stddev},  {"p90", s.p90},   {"p99", s.p99}};
}

}  // namespace

std::string FormatServeReport(const ServeRunInfo& info, const ServeMetrics& m) {
  std::string out = Rule(" Serving Benchmark Result ", '=');
  out += Row("Endpoint:", info.base_url + info.endpoint);
  out += Row("Model:", info.model);
  out += Row("Dataset:", info.dataset);
  out += Row("Request rate:", Rate(info.arrivals));
  out += Row("Maximum request concurrency:",
             info.max_concurrency > 0 ? std::to_string(info.max_concurrency) : "unbounded");
  out += Row("Successful requests:", std::to_string(m.completed));
  out += Row("Failed requests:", std::to_string(m.failed));
  if (m.refused > 0) {
    out += Row("  of which refused (HTTP 429):", std::to_string(m.refused));
    out += Row("  time to refusal p50/p99 (ms):",
               Num(m.refused_ms.median) + " / " + Num(m.refused_ms.p99));
  }
  out += Row("Peak requests in flight:", std::to_string(m.peak_in_flight));
  out += Row("Benchmark duration (s):", Num(m.duration_s));
  std::string input = std::to_string(m.total_input_tokens);
  if (m.completed > 0 && m.input_tokens_from_usage < m.completed) {
    input += m.input_tokens_from_usage == 0 ? " (approx: word count)" : " (partly approx)";
  }
  out += Row("Total input tokens:", input);
  std::string output = std::to_string(m.total_output_tokens);
  if (m.completed > 0 && m.output_tokens_from_usage < m.completed) {
    output += m.output_tokens_from_usage == 0 ? " (counted chunks)" : " (partly chunks)";
  }
  out += Row("Total generated tokens:", output);
  out += Row("Request throughput (req/s):", Num(m.request_throughput));
  out += Row("Output token throughput (tok/s):", Num(m.output_throughput));
  if (m.failed > 0) {
    out += Row("Tokens streamed by failed requests:", std::to_string(m.failed_output_tokens));
    out += Row("Output throughput with them (tok/s):", Num(m.output_throughput_with_failed));
  }
  out += Row("Total Token throughput (tok/s):", Num(m.total_token_throughput));
  if (m.cached_tokens_from_usage > 0) {
    out +=
        Row("Prefix cache hit rate:", Num(100 * m.prefix_cache_hit_rate, 1) + "% of prompt tokens");
    out += Row("Cached prompt tokens:", std::to_string(m.total_cached_tokens));
  } else if (m.completed > 0) {
    out += Row("Prefix cache hit rate:", "n/a (no cached_tokens in usage)");
  }
  out += Section("Time to First Token", "TTFT", m.ttft_ms);
  for (size_t t = 0; t < m.ttft_ms_by_turn.size(); ++t) {
    const MetricSummary& s = m.ttft_ms_by_turn[t];
    out += Row("Mean TTFT turn " + std::to_string(t + 1) + " (ms):",
               Num(s.mean) + " (n=" + std::to_string(s.count) + ")");
  }
  out += Section("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  out += Section("Inter-token Latency", "ITL", m.itl_ms);
  out += Section("End-to-end Latency", "E2EL", m.e2el_ms);
  out += std::string(kWidth, '=') + "\n";
  for (size_t i = 0; i < m.errors.size() && i < 5; ++i) out += "error: " + m.errors[i] + "\n";
  if (m.errors.size() > 5) {
    out += "(" + std::to_string(m.errors.size() - 5) + " more distinct errors in --json)\n";
  }
  return out;
}

nlohmann::json ServeReportJson(const ServeRunInfo& info, const ServeMetrics& m,
                               const BenchmarkRun& run) {
  nlohmann::json j;
  j["base_url"] = info.base_url;
  j["endpoint"] = info.endpoint;
  j["model"] = info.model;
  j["dataset"] = info.dataset;
  j["num_prompts"] = info.num_prompts;
  j["input_len"] = info.input_len;
  j["output_len"] = info.output_len;
  j["prefix_len"] = info.prefix_len;
  j["request_rate"] = std::isinf(info.arrivals.request_rate)
                          ? nlohmann::json("inf")
                          : nlohmann::json(info.arrivals.request_rate);
  j["arrival"] = info.arrivals.process == ArrivalProcess::kFixed ? "fixed" : "poisson";
  j["burstiness"] = info.arrivals.burstiness;
  j["seed"] = info.arrivals.seed;
  j["max_concurrency"] =
      info.max_concurrency > 0 ? nlohmann::json(info.max_concurrency) : nlohmann::json(nullptr);
  j["ignore_eos"] = info.ignore_eos;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["refused_429"] = m.refused;
  j["refused_ms"] = SummaryJson(m.refused_ms);
  j["duration_s"] = m.duration_s;
  j["peak_in_flight"] = m.peak_in_flight;
  j["total_input_tokens"] = m.total_input_tokens;
  j["input_tokens_from_usage"] = m.input_tokens_from_usage;
  j["total_output_tokens"] = m.total_output_tokens;
  j["output_tokens_from_usage"] = m.output_tokens_from_usage;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["failed_output_tokens"] = m.failed_output_tokens;
  j["output_throughput_with_failed"] = m.output_throughput_with_failed;
  j["total_token_throughput"] = m.total_token_throughput;
  j["total_cached_tokens"] = m.total_cached_tokens;
  j["cached_tokens_from_usage"] = m.cached_tokens_from_usage;
  j["prefix_cache_hit_rate"] = m.prefix_cache_hit_rate >= 0
                                   ? nlohmann::json(m.prefix_cache_hit_rate)
                                   : nlohmann::json(nullptr);
  nlohmann::json by_turn = nlohmann::json::array();
  for (const MetricSummary& s : m.ttft_ms_by_turn) by_turn.push_back(SummaryJson(s));
  if (!by_turn.empty()) j["ttft_ms_by_turn"] = by_turn;
  j["ttft_ms"] = SummaryJson(m.ttft_ms);
  j["tpot_ms"] = SummaryJson(m.tpot_ms);
  j["itl_ms"] = SummaryJson(m.itl_ms);
  j["e2el_ms"] = SummaryJson(m.e2el_ms);
  j["errors"] = m.errors;
  nlohmann::json ttfts = nlohmann::json::array(), e2els = nlohmann::json::array(),
                 output_tokens = nlohmann::json::array(), prompt_tokens = nlohmann::json::array(),
                 send_offsets = nlohmann::json::array(), errors = nlohmann::json::array(),
                 cached_tokens = nlohmann::json::array();
  for (const RequestOutcome& o : run.outcomes) {
    ttfts.push_back(o.ok ? nlohmann::json(o.ttft_s * 1e3) : nlohmann::json(nullptr));
    e2els.push_back(o.ok ? nlohmann::json(o.e2e_s * 1e3) : nlohmann::json(nullptr));
    output_tokens.push_back(o.output_tokens);
    prompt_tokens.push_back(o.prompt_tokens >= 0 ? nlohmann::json(o.prompt_tokens)
                                                 : nlohmann::json(nullptr));
    send_offsets.push_back(o.send_offset_s);
    cached_tokens.push_back(o.cached_tokens >= 0 ? nlohmann::json(o.cached_tokens)
                                                 : nlohmann::json(nullptr));
    errors.push_back(o.error);
  }
  j["requests"] = {{"ttft_ms", ttfts},
                   {"e2el_ms", e2els},
                   {"output_tokens", output_tokens},
                   {"prompt_tokens", prompt_tokens},
                   {"cached_tokens", cached_tokens},
                   {"send_offset_s", send_offsets},
                   {"error", errors}};
  return j;
}

}  // namespace tessera::bench
