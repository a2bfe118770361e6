// The serve benchmark: sends a dataset's requests to an OpenAI-compatible server on
// an arrival schedule, bounded by a maximum concurrency, and reduces what each
// request measured to vLLM benchmark_serving's metrics (throughput; TTFT, TPOT,
// ITL, end-to-end latency). Layer: bench; used by `tessera bench serve` and tests.
// Each in-flight request runs on its own thread; RunServeBenchmark returns when
// all have finished. A conversation's later turn (BenchRequest::previous_turn) is
// sent once its previous turn has finished, with the conversation so far prepended.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bench/arrivals.h"
#include "bench/dataset.h"
#include "bench/openai_client.h"
#include "bench/stats.h"

namespace tessera::bench {

struct LoadOptions {
  ArrivalOptions arrivals;
  int64_t max_concurrency = 0;  // requests in flight at most; 0 = unbounded
  // Called once per request as it finishes (or fails), from that request's thread:
  // must be thread-safe. Used for the progress bar; may be empty.
  std::function<void(const RequestOutcome&)> on_request_done;
};

struct BenchmarkRun {
  std::vector<RequestOutcome> outcomes;  // one per request, in dataset order
  double duration_s = 0;                 // first send to last response
  int64_t peak_in_flight = 0;            // most requests in flight at once
};

BenchmarkRun RunServeBenchmark(const EndpointOptions& endpoint, const LoadOptions& load,
                               std::span<const BenchRequest> requests);

struct ServeMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  // Of the failed: refused with HTTP 429 (the server's queue was full), and how
  // long each took to be refused (ms): an overloaded server should say no quickly.
  int64_t refused = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;       // usage.prompt_tokens where sent, else the word count
  int64_t input_tokens_from_usage = 0;  // requests whose input count is exact
  int64_t total_output_tokens = 0;
  int64_t output_tokens_from_usage = 0;  // requests whose output count is the server's
  double request_throughput = 0;         // completed requests / s
  double output_throughput = 0;          // output tokens / s
  // Text chunks that failed requests streamed before their error (a server that
  // fails a stream at its end has still done the work: throughput with them is the
  // fair figure to compare it by).
  int64_t failed_output_tokens = 0;
  double output_throughput_with_failed = 0;  // (output + failed output tokens) / s
  double total_token_throughput = 0;         // (input + output) tokens / s
  int64_t peak_in_flight = 0;
  // usage.prompt_tokens_details.cached_tokens summed over the requests that sent
  // it, their prompt tokens, how many did, and cached / prompt tokens over them
  // (the server's prefix-cache hit rate as this workload saw it; -1 when none sent it).
  int64_t total_cached_tokens = 0;
  int64_t cached_tokens_input = 0;
  int64_t cached_tokens_from_usage = 0;
  double prefix_cache_hit_rate = -1;
  // Milliseconds. TPOT per request = (e2e − TTFT) / (output tokens − 1), for
  // requests with more than one output token; ITL pools every gap of every request.
  MetricSummary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  MetricSummary refused_ms;
  std::vector<MetricSummary> ttft_ms_by_turn;  // multi-turn: [turn - 1]
  std::vector<std::string> errors;  // distinct failure messages with counts, most frequent first
};

// Metrics over the completed requests of `run` (failures only counted).
ServeMetrics ComputeServeMetrics(std::span<const BenchRequest> requests, const BenchmarkRun& run);

}  // namespace tessera::bench
