// A request-rate sweep for `tessera bench serve --request-rates 1,2,4,inf`: the
// rate list's parser and the summary table with one row per rate. Layer: bench;
// used by the CLI and the plot writer. Pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "bench/serve_benchmark.h"

namespace tessera::bench {

// One benchmark of a sweep: the rate it ran at and what it measured.
struct SweepPoint {
  double request_rate = 0;  // requests/s; inf = all at once
  ServeMetrics metrics;
};

// Parses "1,2,4,inf" (spaces around items allowed). Each item is a finite number
// > 0 or "inf"; InvalidArgument for an empty list or item, anything else, or a
// rate listed twice. Order is kept: the sweep runs the rates as given.
Result<std::vector<double>> ParseRequestRates(std::string_view text);

// "4" / "0.5" / "inf": a rate as a short label (also the plot's point labels).
std::string RateLabel(double request_rate);

// The summary table: rate, req/s, output tok/s, TTFT/TPOT/E2EL p50 and p99 (ms).
std::string FormatSweepSummary(std::span<const SweepPoint> points);

}  // namespace tessera::bench
