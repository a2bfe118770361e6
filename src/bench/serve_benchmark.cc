#include "bench/serve_benchmark.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <semaphore>
#include <thread>

#include "base/check.h"
#include "base/clock.h"

namespace tessera::bench {

BenchmarkRun RunServeBenchmark(const EndpointOptions& endpoint, const LoadOptions& load,
                               std::span<const BenchRequest> requests) {
  BenchmarkRun run;
  run.outcomes.resize(requests.size());
  const std::vector<double> offsets =
      ArrivalOffsetsSeconds(static_cast<int64_t>(requests.size()), load.arrivals);
  const bool bounded = load.max_concurrency > 0;
  std::counting_semaphore<> slots(bounded ? load.max_concurrency : 0);
  std::mutex mu;  // guards in_flight and run.peak_in_flight
  int64_t in_flight = 0;

  std::vector<std::thread> workers;
  workers.reserve(requests.size());
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(offsets[i])));
    if (bounded) slots.acquire();
    {
      std::lock_guard<std::mutex> lock(mu);
      run.peak_in_flight = std::max(run.peak_in_flight, ++in_flight);
    }
    const double send_offset_s = std::chrono::duration<double>(Clock::now() - start).count();
    auto work = [&, i, send_offset_s] {
      RequestOutcome outcome = SendStreamingRequest(endpoint, requests[i]);
      outcome.send_offset_s = send_offset_s;
      run.outcomes[i] = std::move(outcome);
      if (load.on_request_done) load.on_request_done(run.outcomes[i]);
      {
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
      }
      if (bounded) slots.release();
    };
    try {
      workers.emplace_back(work);
    } catch (const std::exception& e) {  // out of threads: this request fails, the run goes on
      run.outcomes[i].error = std::string("could not start a request thread: ") + e.what() +
                              " (lower --max-concurrency)";
      run.outcomes[i].send_offset_s = send_offset_s;
      if (load.on_request_done) load.on_request_done(run.outcomes[i]);
      {
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
      }
      if (bounded) slots.release();
    }
  }
  for (std::thread& t : workers) t.join();
  run.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

ServeMetrics ComputeServeMetrics(std::span<const BenchRequest> requests, const BenchmarkRun& run) {
  TESSERA_CHECK(requests.size() == run.outcomes.size())
      << requests.size() << " requests, " << run.outcomes.size() << " outcomes";
  ServeMetrics m;
  m.duration_s = run.duration_s;
  m.peak_in_flight = run.peak_in_flight;
  std::vector<double> ttft, tpot, itl, e2el;
  std::map<std::string, int64_t> error_counts;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestOutcome& o = run.outcomes[i];
    if (!o.ok) {
      ++m.failed;
      m.failed_output_tokens += o.num_text_chunks;
      ++error_counts[o.error];
      continue;
    }
    ++m.completed;
    if (o.prompt_tokens >= 0) {
      m.total_input_tokens += o.prompt_tokens;
      ++m.input_tokens_from_usage;
    } else {
      m.total_input_tokens += requests[i].approx_prompt_tokens;
    }
    m.total_output_tokens += o.output_tokens;
    if (o.output_tokens_from_usage) ++m.output_tokens_from_usage;
    ttft.push_back(o.ttft_s * 1e3);
    e2el.push_back(o.e2e_s * 1e3);
    if (o.output_tokens > 1) {
      tpot.push_back((o.e2e_s - o.ttft_s) / static_cast<double>(o.output_tokens - 1) * 1e3);
    }
    for (double gap : o.itl_s) itl.push_back(gap * 1e3);
  }
  if (m.duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / m.duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / m.duration_s;
    m.output_throughput_with_failed =
        static_cast<double>(m.total_output_tokens + m.failed_output_tokens) / m.duration_s;
    m.total_token_throughput =
        static_cast<double>(m.total_input_tokens + m.total_output_tokens) / m.duration_s;
  }
  m.ttft_ms = Summarize(std::move(ttft));
  m.tpot_ms = Summarize(std::move(tpot));
  m.itl_ms = Summarize(std::move(itl));
  m.e2el_ms = Summarize(std::move(e2el));
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [message, count] : error_counts) by_count.emplace_back(count, message);
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [count, message] : by_count) {
    m.errors.push_back(std::to_string(count) + " × " + message);
  }
  return m;
}

}  // namespace tessera::bench
