// Summary statistics of a latency sample: mean, standard deviation, median, p90,
// p99. Layer: bench; used by the serve benchmark's metrics and its tests.
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace tessera::bench {

struct MetricSummary {
  size_t count = 0;
  double mean = 0;
  double stddev = 0;  // population standard deviation (as numpy.std)
  double median = 0;
  double p90 = 0;
  double p99 = 0;
};

// The `pct`-th percentile (0..100) of an ascending sample, interpolated linearly
// between the two nearest ranks (numpy.percentile's default). 0 for an empty sample.
double Percentile(std::span<const double> sorted, double pct);

// Summary of `values` (any order). All fields 0 for an empty sample.
MetricSummary Summarize(std::vector<double> values);

}  // namespace tessera::bench
