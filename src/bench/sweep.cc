#include "bench/sweep.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace tessera::bench {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::vector<double>> ParseRequestRates(std::string_view text) {
  const std::string quoted = "--request-rates '" + std::string(text) + "'";
  if (Trim(text).empty()) {
    return InvalidArgumentError(quoted + ": empty; give rates such as 1,2,4,inf");
  }
  std::vector<double> rates;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string_view item = Trim(
        text.substr(begin, comma == std::string_view::npos ? text.size() - begin : comma - begin));
    if (item.empty()) return InvalidArgumentError(quoted + ": empty item");
    double rate = 0;
    if (item == "inf") {
      rate = std::numeric_limits<double>::infinity();
    } else {
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), rate);
      if (ec != std::errc() || end != item.data() + item.size() || !std::isfinite(rate)) {
        return InvalidArgumentError(quoted + ": '" + std::string(item) +
                                    "' is not a number (or inf)");
      }
      if (!(rate > 0)) {
        return InvalidArgumentError(quoted + ": '" + std::string(item) + "' is not > 0");
      }
    }
    for (double seen : rates) {
      if (seen == rate) {
        return InvalidArgumentError(quoted + ": rate " + RateLabel(rate) + " listed twice");
      }
    }
    rates.push_back(rate);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return rates;
}

std::string RateLabel(double request_rate) {
  if (std::isinf(request_rate)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", request_rate);
  return buf;
}

std::string FormatSweepSummary(std::span<const SweepPoint> points) {
  std::string out =
      "=================================== Request-rate sweep "
      "===================================\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %5s %8s %10s %9s %9s %8s %8s %9s %9s\n", "rate", "ok",
                "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2EL p50",
                "E2EL p99");
  out += line;
  for (const SweepPoint& p : points) {
    const ServeMetrics& m = p.metrics;
    const std::string ok =
        std::to_string(m.completed) + "/" + std::to_string(m.completed + m.failed);
    std::snprintf(line, sizeof line, "%-6s %5s %8.2f %10.2f %9.2f %9.2f %8.2f %8.2f %9.2f %9.2f\n",
                  RateLabel(p.request_rate).c_str(), ok.c_str(), m.request_throughput,
                  m.output_throughput, m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median,
                  m.tpot_ms.p99, m.e2el_ms.median, m.e2el_ms.p99);
    out += line;
  }
  out += "(rate: requests/s asked for; latencies in ms; ok: successful/sent)\n";
  return out;
}

}  // namespace tessera::bench
