// Metrics: what GET /metrics reports, in the Prometheus text format (version
// 0.0.4) — the scheduler's gauges and token counters, TTFT / TPOT / end-to-end
// latency histograms, request and error counters, and the bytes the driver rank
// moved on each communicator group (from MeteredExecutor); and, for the live view
// (ui_state), every rank's latest reports and the recent requests' latencies.
// Layer: serve.
// Thread-safe: HTTP threads observe requests, the scheduler thread records comm
// totals, and Render may run concurrently with both.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/ledger.h"
#include "engine/rank_report.h"
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
  int ep = 1;                      // the EP degree
  std::vector<int> expert_home;    // ep > 1: the EP rank each expert lives on (its first holder)
  std::vector<int> expert_copies;  // ep > 1: the EP ranks holding each expert now
  // ep > 1: rows each EP rank's experts computed (every group and stage; with
  // replicas the real work), as of the last poll of the ranks' reports.
  std::vector<int64_t> ep_rows_computed;
  // Live re-placement (engine::ExpertRebalancer).
  int64_t ep_rebalances = 0;
  double ep_rebalance_last_seconds = 0;
  double ep_busiest_before = 0, ep_busiest_after = 0;  // busiest rank / mean, last re-placement
};

// One finished request, for the live view's recent-latency series.
struct RecentRequest {
  int64_t finished_ns = 0;  // NowNs() when it finished
  double ttft_s = -1;       // < 0: no token
  double tpot_s = -1;       // < 0: fewer than 2 tokens
  double e2e_s = 0;
};

// Every rank's reports at one moment (Driver::PollReports), by rank.
struct RankSample {
  int64_t at_ns = 0;  // 0: none yet
  std::vector<engine::RankReport> reports;
};

// What the live view reads: copies, taken under the lock.
struct LiveView {
  RankSample ranks;                   // the latest sample
  RankSample ranks_before;            // the one before it (at_ns 0: none, or another world)
  std::vector<RecentRequest> recent;  // oldest first, the last kRecentWindowNs
  CommTotals comm;
};

class Metrics {
 public:
  // How far back the recent requests go (5 minutes).
  static constexpr int64_t kRecentWindowNs = int64_t{300} * 1'000'000'000;
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
  // Every rank's reports at at_ns (the live view's per-rank time shares and
  // ledgers); the previous sample is kept to compare with.
  void SetRanks(std::vector<engine::RankReport> reports, int64_t at_ns);
  LiveView Live(int64_t now_ns) const;

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
  RankSample ranks_now_, ranks_before_;
  mutable std::deque<RecentRequest> recent_;  // pruned to kRecentWindowNs on read and write
};

// The Prometheus text of several replicas' /metrics as one: every sample gets a
// replica="i" label (before its own labels), and every metric family keeps one
// HELP and one TYPE line with all its samples together, in the order families
// first appear (as the format asks). Lines that are neither are dropped.
std::string MergeReplicaMetrics(const std::vector<std::pair<int, std::string>>& replicas);

}  // namespace tessera::serve
