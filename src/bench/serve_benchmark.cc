#include "bench/serve_benchmark.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
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
  std::mutex mu;  // guards in_flight, run.peak_in_flight and finished
  int64_t in_flight = 0;
  // A conversation's next turn waits for the previous one: finished[i] is set
  // when request i is done; sent_prompts[i] is the prompt it was sent.
  std::condition_variable finished_cv;
  std::vector<bool> finished(requests.size(), false);
  std::vector<BenchRequest> sent(requests.begin(), requests.end());

  std::vector<std::thread> workers;
  workers.reserve(requests.size());
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(offsets[i])));
    if (const int64_t prev = requests[i].previous_turn; prev >= 0) {
      TESSERA_CHECK(prev < static_cast<int64_t>(i)) << "turn " << i << " continues " << prev;
      std::unique_lock<std::mutex> lock(mu);
      finished_cv.wait(lock, [&] { return finished[static_cast<size_t>(prev)]; });
      // The conversation so far (the previous prompt and the answer it got), then
      // the new question.
      const size_t p = static_cast<size_t>(prev);
      sent[i].prompt = sent[p].prompt + run.outcomes[p].text + requests[i].prompt;
      sent[i].approx_prompt_tokens = sent[p].approx_prompt_tokens + run.outcomes[p].output_tokens +
                                     requests[i].approx_prompt_tokens;
    }
    if (bounded) slots.acquire();
    {
      std::lock_guard<std::mutex> lock(mu);
      run.peak_in_flight = std::max(run.peak_in_flight, ++in_flight);
    }
    const double send_offset_s = std::chrono::duration<double>(Clock::now() - start).count();
    auto work = [&, i, send_offset_s] {
      RequestOutcome outcome = SendStreamingRequest(endpoint, sent[i]);
      outcome.send_offset_s = send_offset_s;
      run.outcomes[i] = std::move(outcome);
      if (load.on_request_done) load.on_request_done(run.outcomes[i]);
      {
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
        finished[i] = true;
      }
      finished_cv.notify_all();
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
        finished[i] = true;
      }
      finished_cv.notify_all();
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
  std::vector<double> ttft, tpot, itl, e2el, refused;
  std::vector<std::vector<double>> ttft_by_turn;
  std::map<std::string, int64_t> error_counts;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestOutcome& o = run.outcomes[i];
    if (!o.ok) {
      ++m.failed;
      m.failed_output_tokens += o.num_text_chunks;
      ++error_counts[o.error];
      if (o.http_status == 429) {
        ++m.refused;
        refused.push_back(o.e2e_s * 1e3);
      }
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
    if (o.cached_tokens >= 0 && o.prompt_tokens >= 0) {
      m.total_cached_tokens += o.cached_tokens;
      m.cached_tokens_input += o.prompt_tokens;
      ++m.cached_tokens_from_usage;
    }
    ttft.push_back(o.ttft_s * 1e3);
    if (const int64_t turn = requests[i].turn; turn > 0) {
      if (static_cast<int64_t>(ttft_by_turn.size()) < turn) {
        ttft_by_turn.resize(static_cast<size_t>(turn));
      }
      ttft_by_turn[static_cast<size_t>(turn - 1)].push_back(o.ttft_s * 1e3);
    }
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
  if (m.cached_tokens_input > 0) {
    m.prefix_cache_hit_rate =
        static_cast<double>(m.total_cached_tokens) / static_cast<double>(m.cached_tokens_input);
  }
  for (std::vector<double>& t : ttft_by_turn) m.ttft_ms_by_turn.push_back(Summarize(std::move(t)));
  m.ttft_ms = Summarize(std::move(ttft));
  m.tpot_ms = Summarize(std::move(tpot));
  m.itl_ms = Summarize(std::move(itl));
  m.e2el_ms = Summarize(std::move(e2el));
  m.refused_ms = Summarize(std::move(refused));
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
