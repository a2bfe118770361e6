// When each benchmark request is sent: a Poisson process (or, with burstiness,
// a gamma process, as vLLM's benchmark_serving), a fixed interval, or all at once.
// Layer: bench; used by the serve benchmark runner. Pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace tessera::bench {

enum class ArrivalProcess {
  kPoisson,  // gamma-distributed gaps, shape = burstiness (1 = exponential = Poisson)
  kFixed,    // every gap exactly 1 / request_rate
};

struct ArrivalOptions {
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf = all at t=0
  ArrivalProcess process = ArrivalProcess::kPoisson;
  double burstiness = 1.0;  // gamma shape; < 1 burstier, > 1 more even; mean rate unchanged
  uint64_t seed = 0;
};

// Send times in seconds from the start, ascending, the first at 0. CHECKs that the
// rate and burstiness are > 0.
std::vector<double> ArrivalOffsetsSeconds(int64_t num_requests, const ArrivalOptions& options);

}  // namespace tessera::bench
