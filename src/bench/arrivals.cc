#include "bench/arrivals.h"

#include <cmath>
#include <random>

#include "base/check.h"

namespace tessera::bench {

std::vector<double> ArrivalOffsetsSeconds(int64_t num_requests, const ArrivalOptions& options) {
  TESSERA_CHECK(options.request_rate > 0) << "request rate " << options.request_rate;
  TESSERA_CHECK(options.burstiness > 0) << "burstiness " << options.burstiness;
  std::vector<double> offsets(static_cast<size_t>(std::max<int64_t>(num_requests, 0)), 0.0);
  if (std::isinf(options.request_rate)) return offsets;
  const double mean_gap_s = 1.0 / options.request_rate;
  std::mt19937_64 rng(options.seed);
  // Gamma(shape k, scale θ) has mean kθ; θ = mean_gap / k keeps the mean rate.
  std::gamma_distribution<double> gamma(options.burstiness, mean_gap_s / options.burstiness);
  double t = 0;
  for (size_t i = 1; i < offsets.size(); ++i) {
    t += options.process == ArrivalProcess::kFixed ? mean_gap_s : gamma(rng);
    offsets[i] = t;
  }
  return offsets;
}

}  // namespace tessera::bench
