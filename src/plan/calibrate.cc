#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

namespace tessera::plan {
namespace {

using nlohmann::json;

// 8 independent accumulator chains × 8 lanes keep the FMA units busy whatever the
// vector width the compiler picks; the result feeds a volatile sink.
double FmaLoop(int64_t iterations) {
  constexpr int kLanes = 64;
  float acc[kLanes];
  float mul[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    acc[i] = 0.001f * static_cast<float>(i);
    mul[i] = 0.9999f;
  }
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kLanes; ++i) acc[i] = acc[i] * mul[i] + 0.0001f;
  }
  float sum = 0;
  for (float a : acc) sum += a;
  volatile float sink = sum;
  (void)sink;
  return 2.0 * kLanes * static_cast<double>(iterations);
}

double StepsOf(std::string_view op, std::string_view algo, int64_t np) {
  if (np <= 1) return 1;
  if (algo.find("recursive") != std::string_view::npos || algo == "rd" ||
      algo.find("tree") != std::string_view::npos || algo.find("bruck") != std::string_view::npos) {
    return std::max(1.0, std::ceil(std::log2(static_cast<double>(np))));
  }
  if (op.find("allreduce") != std::string_view::npos ||
      op.find("all_reduce") != std::string_view::npos) {
    return 2.0 * (np - 1);
  }
  if (op.find("gather") != std::string_view::npos || op.find("scatter") != std::string_view::npos ||
      op.find("alltoall") != std::string_view::npos ||
      op.find("all_to_all") != std::string_view::npos) {
    return static_cast<double>(np - 1);
  }
  return 1;
}

}  // namespace

double MeasureFlopsPerThread(double seconds, int repetitions) {
  using Clock = std::chrono::steady_clock;
  // Size the run: double the iterations until one takes a tenth of `seconds`.
  int64_t iterations = 1 << 16;
  for (;;) {
    const auto start = Clock::now();
    FmaLoop(iterations);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (took >= seconds / 10 || iterations > (int64_t{1} << 40)) {
      iterations = static_cast<int64_t>(iterations * (seconds / std::max(took, 1e-9)));
      break;
    }
    iterations *= 2;
  }
  double best = 0;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = Clock::now();
    const double flops = FmaLoop(iterations);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, flops / took);
  }
  return best;
}

Result<std::map<std::string, Link>> FitLinksFromBenchJson(std::string_view json_text) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgumentError("bench comm output is not JSON");
  if (doc.is_object()) {
    if (doc.contains("records")) {
      doc = doc["records"];
    } else if (doc.contains("results")) {
      doc = doc["results"];
    }
  }
  if (!doc.is_array()) return InvalidArgumentError("bench comm JSON: expected an array of records");
  struct Fit {
    double best_busbw = 0;
    double alpha_us = 1e300;
  };
  std::map<std::string, Fit> fits;
  for (const json& r : doc) {
    if (!r.is_object() || !r.contains("time_us") || !r.contains("bytes")) continue;
    if (r.value("wrong", int64_t{0}) != 0) continue;
    const std::string transport = r.value("transport", std::string("unknown"));
    const std::string op = r.value("op", std::string(""));
    const std::string algo = r.value("algo", std::string(""));
    const int64_t np = r.value("np", int64_t{2});
    const double bytes = r["bytes"].get<double>();
    const double time_us = r["time_us"].get<double>();
    Fit& fit = fits[transport];
    if (bytes >= (1 << 20) && r.contains("busbw_gbps")) {
      fit.best_busbw = std::max(fit.best_busbw, r["busbw_gbps"].get<double>());
    }
    if (time_us > 0) fit.alpha_us = std::min(fit.alpha_us, time_us / StepsOf(op, algo, np));
  }
  std::map<std::string, Link> links;
  for (const auto& [transport, fit] : fits) {
    if (fit.best_busbw <= 0 || fit.alpha_us >= 1e300) continue;
    links[transport] = Link{transport + " (measured)", fit.best_busbw, fit.alpha_us};
  }
  if (links.empty()) {
    return InvalidArgumentError(
        "bench comm JSON: no transport has both a >= 1 MiB record with busbw_gbps and a timed "
        "record");
  }
  return links;
}

}  // namespace tessera::plan
