// Metrics: what GET /metrics reports, in the Prometheus text format (version
// 0.0.4) — the scheduler's gauges and token counters, TTFT / TPOT / end-to-end
// latency histograms, request and error counters, and the bytes the driver rank
// moved on each communicator group (from MeteredExecutor). Layer: serve.
// Thread-safe: HTTP threads observe requests, the scheduler thread records comm
// totals, and Render may run concurrently with both.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/ledger.h"
#include "engine/scheduler.h"

namespace tessera::serve {

// A cumulative histogram with fixed upper bounds (seconds). Not thread-safe alone.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // "# HELP", "# TYPE … histogram", the _bucket{le=…} lines, _sum and _count.
  void Render(std::string_view name, std::string_view help, std::string* out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds_.size() + 1], the last is +Inf (non-cumulative)
  double sum_ = 0;
  int64_t count_ = 0;
};

// The communication the driver rank did, per group ("tp", "pp", "ctl").
struct CommTotals {
  std::map<std::string, comm::LedgerEntry> by_group;
  double comm_seconds = 0;
  // MoE: (token, choice) rows routed to each expert in the driver's stage, over
  // its EP group's tokens (engine::RankReport::expert_rows_total); empty if dense.
  std::vector<int64_t> expert_rows;
  int ep = 1;                    // the EP degree
  std::vector<int> expert_home;  // ep > 1: the EP rank each expert lives on (its first holder)
};

class Metrics {
 public:
  Metrics();

  // One finished request: its latencies (tpot_s < 0 when it produced < 2 tokens),
  // its finish reason ("stop", "length", "cancelled", "error") and endpoint.
  void ObserveRequest(std::string_view endpoint, std::string_view finish_reason, double ttft_s,
                      double tpot_s, double e2e_s);
  // Where a finished request's time went (the scheduler's RequestTiming).
  void ObserveTiming(const engine::RequestTiming& timing);
  // A request refused with an HTTP error status (4xx/5xx).
  void CountHttpError(int http_status);
  void SetComm(CommTotals totals);

  // The whole exposition: scheduler stats (running, waiting, KV usage, token
  // counters) followed by this object's histograms and counters.
  std::string Render(const engine::SchedulerStats& stats) const;

 private:
  mutable std::mutex mutex_;
  Histogram ttft_, tpot_, e2e_;
  Histogram queue_, prefill_, decode_;
  Histogram kv_transfer_, kv_handoff_;  // prefill/decode disaggregation (decode side)
  double request_comm_seconds_ = 0;     // summed over requests' shares
  std::map<std::pair<std::string, std::string>, int64_t> requests_;  // (endpoint, reason)
  std::map<int, int64_t> http_errors_;
  CommTotals comm_;
};

}  // namespace tessera::serve
