#include "serve/metrics.h"

#include <cstdio>
#include <map>

#include "base/clock.h"

namespace tessera::serve {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void Header(std::string_view name, std::string_view type, std::string_view help, std::string* out) {
  *out += "# HELP ";
  *out += name;
  *out += " ";
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += " ";
  *out += type;
  *out += "\n";
}

void Scalar(std::string_view name, std::string_view type, std::string_view help, double value,
            std::string* out) {
  Header(name, type, help, out);
  *out += std::string(name) + " " + Num(value) + "\n";
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(std::string_view name, std::string_view help, std::string* out) const {
  Header(name, "histogram", help, out);
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? Num(bounds_[i]) : "+Inf";
    *out += std::string(name) + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += std::string(name) + "_sum " + Num(sum_) + "\n";
  *out += std::string(name) + "_count " + std::to_string(count_) + "\n";
}

namespace {
// Prefill/decode hand-offs: 100 us to 10 s, 1-2-5 steps.
std::vector<double> HandoffBuckets() {
  std::vector<double> bounds;
  for (double decade = 1e-4; decade < 10; decade *= 10) {
    for (double step : {1.0, 2.0, 5.0}) bounds.push_back(decade * step);
  }
  bounds.push_back(10);
  return bounds;
}
}  // namespace

Metrics::Metrics()
    : ttft_(LatencyBuckets()),
      tpot_(LatencyBuckets()),
      e2e_(LatencyBuckets()),
      queue_(LatencyBuckets()),
      prefill_(LatencyBuckets()),
      decode_(LatencyBuckets()),
      kv_transfer_(HandoffBuckets()),
      kv_handoff_(HandoffBuckets()) {}

void Metrics::ObserveRequest(std::string_view endpoint, std::string_view finish_reason,
                             double ttft_s, double tpot_s, double e2e_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ttft_s >= 0) ttft_.Observe(ttft_s);
  if (tpot_s >= 0) tpot_.Observe(tpot_s);
  e2e_.Observe(e2e_s);
  ++requests_[{std::string(endpoint), std::string(finish_reason)}];
  const int64_t now = NowNs();
  recent_.push_back({.finished_ns = now, .ttft_s = ttft_s, .tpot_s = tpot_s, .e2e_s = e2e_s});
  while (!recent_.empty() && recent_.front().finished_ns < now - kRecentWindowNs) {
    recent_.pop_front();
  }
}

void Metrics::SetRanks(std::vector<engine::RankReport> reports, int64_t at_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A new world (after a restart its counters start from zero) has nothing to compare with.
  const bool same_world = ranks_now_.reports.size() == reports.size();
  ranks_before_ = same_world ? std::move(ranks_now_) : RankSample{};
  ranks_now_ = {.at_ns = at_ns, .reports = std::move(reports)};
}

LiveView Metrics::Live(int64_t now_ns) const {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!recent_.empty() && recent_.front().finished_ns < now_ns - kRecentWindowNs) {
    recent_.pop_front();
  }
  return {.ranks = ranks_now_,
          .ranks_before = ranks_before_,
          .recent = {recent_.begin(), recent_.end()},
          .comm = comm_};
}

void Metrics::ObserveTiming(const engine::RequestTiming& timing) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.Observe(timing.queue_s);
  prefill_.Observe(timing.prefill_s);
  decode_.Observe(timing.decode_s);
  request_comm_seconds_ += timing.comm_s;
  if (timing.kv_transfer_s >= 0) kv_transfer_.Observe(timing.kv_transfer_s);
  if (timing.kv_handoff_s >= 0) kv_handoff_.Observe(timing.kv_handoff_s);
}

void Metrics::CountHttpError(int http_status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++http_errors_[http_status];
}

void Metrics::SetComm(CommTotals totals) {
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = std::move(totals);
}

std::string Metrics::Render(const engine::SchedulerStats& s) const {
  std::string out;
  Scalar("tessera_num_requests_running", "gauge", "Requests being generated", s.running, &out);
  Scalar("tessera_num_requests_waiting", "gauge", "Requests queued", s.waiting, &out);
  Scalar("tessera_kv_cache_blocks_used", "gauge", "KV cache blocks in use", s.kv_blocks_used, &out);
  Scalar("tessera_kv_cache_blocks_total", "gauge", "KV cache blocks", s.kv_blocks_total, &out);
  Scalar("tessera_kv_cache_usage_ratio", "gauge", "Fraction of the KV cache in use (0..1)",
         s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0,
         &out);
  Scalar("tessera_prompt_tokens_total", "counter", "Prompt tokens prefilled", s.prompt_tokens_total,
         &out);
  Scalar("tessera_generation_tokens_total", "counter", "Tokens generated",
         s.generation_tokens_total, &out);
  Scalar("tessera_preemptions_total", "counter", "Sequences preempted for KV blocks",
         s.preemptions_total, &out);
  Scalar("tessera_steps_total", "counter", "Model steps run", s.steps_total, &out);
  Scalar("tessera_engine_restarts_total", "counter",
         "Times the engine's ranks were restarted after a failure", s.engine_restarts_total, &out);
  Scalar("tessera_engine_recovering", "gauge",
         "1 while the engine is being restarted (requests queue meanwhile)", s.recovering ? 1 : 0,
         &out);
  Scalar("tessera_prefix_cache_enabled", "gauge", "1 when the prefix cache is on",
         s.prefix_cache_enabled ? 1 : 0, &out);
  Scalar("tessera_prefix_cache_queries_total", "counter",
         "Admissions that looked up the prefix cache", s.prefix_cache_queries_total, &out);
  Scalar("tessera_prefix_cache_query_tokens_total", "counter",
         "Tokens the admissions looked up in the prefix cache", s.prefix_cache_query_tokens_total,
         &out);
  Scalar("tessera_prefix_cache_hit_tokens_total", "counter",
         "Tokens whose KV came from the prefix cache", s.prefix_cache_hit_tokens_total, &out);
  Scalar("tessera_prefix_cache_hit_blocks_total", "counter",
         "Full KV blocks taken from the prefix cache", s.prefix_cache_hit_blocks_total, &out);
  Scalar("tessera_prefix_cache_hit_rate", "gauge",
         "Hit tokens / query tokens of the prefix cache since start (0..1)",
         s.prefix_cache_query_tokens_total > 0
             ? static_cast<double>(s.prefix_cache_hit_tokens_total) /
                   static_cast<double>(s.prefix_cache_query_tokens_total)
             : 0.0,
         &out);
  Scalar("tessera_prefix_cache_evictions_total", "counter", "Cached KV blocks evicted to make room",
         s.prefix_cache_evictions_total, &out);
  Scalar("tessera_prefix_cache_waits_total", "counter",
         "Admissions put off a step to take blocks a running request was computing",
         s.prefix_cache_waits_total, &out);
  Scalar("tessera_kv_cache_blocks_cached", "gauge",
         "KV blocks held by the prefix cache (owned by sequences or not)", s.kv_blocks_cached,
         &out);
  Scalar("tessera_kv_cache_blocks_evictable", "gauge",
         "Cached KV blocks no sequence owns (free to evict; not counted as used)",
         s.kv_blocks_evictable, &out);
  Scalar("tessera_pd_kv_imports_total", "counter",
         "Prompts whose K/V a prefill instance was asked for (decode instance)", s.kv_imports_total,
         &out);
  Scalar("tessera_pd_kv_import_failures_total", "counter",
         "KV transfers that failed (the prompt was computed here instead)",
         s.kv_import_failures_total, &out);
  Scalar("tessera_pd_kv_import_tokens_total", "counter",
         "Prompt tokens whose K/V arrived from a prefill instance", s.kv_import_tokens_total, &out);
  Scalar("tessera_pd_kv_transfer_bytes_total", "counter",
         "KV bytes received from prefill instances (the planner's KvTransferBytes)",
         s.kv_import_bytes_total, &out);
  Scalar("tessera_pd_kv_streamed_bytes_total", "counter",
         "Of those, bytes that arrived while the prefill still ran (sent as its steps made "
         "blocks final)",
         s.kv_import_streamed_bytes_total, &out);
  Scalar("tessera_pd_kv_exports_total", "counter",
         "Prefills computed for a decode instance (prefill instance)", s.kv_exports_total, &out);
  Scalar("tessera_spec_decode_enabled", "gauge",
         "1 when a speculative proposer is configured (--speculative)",
         s.spec_proposer.empty() ? 0 : 1, &out);
  Scalar("tessera_spec_decode_proposed_tokens_total", "counter",
         "Speculative guesses verified by the target model", s.spec_proposed_tokens_total, &out);
  Scalar("tessera_spec_decode_accepted_tokens_total", "counter",
         "Speculative guesses the target kept", s.spec_accepted_tokens_total, &out);
  Scalar("tessera_spec_decode_verifications_total", "counter",
         "Entries that verified at least one guess", s.spec_verifications_total, &out);
  Scalar("tessera_spec_decode_acceptance_rate", "gauge",
         "Accepted / proposed guesses since start (0..1)",
         s.spec_proposed_tokens_total > 0 ? static_cast<double>(s.spec_accepted_tokens_total) /
                                                static_cast<double>(s.spec_proposed_tokens_total)
                                          : 0.0,
         &out);
  Scalar("tessera_spec_decode_mean_accepted_length", "gauge",
         "Guesses kept per verification since start (each verification also yields the "
         "target's own token)",
         s.spec_verifications_total > 0 ? static_cast<double>(s.spec_accepted_tokens_total) /
                                              static_cast<double>(s.spec_verifications_total)
                                        : 0.0,
         &out);

  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.Render("tessera_time_to_first_token_seconds",
               "Request arrival to its first token (includes queueing and prefill)", &out);
  tpot_.Render("tessera_time_per_output_token_seconds",
               "Mean time between a request's tokens after the first", &out);
  e2e_.Render("tessera_e2e_request_latency_seconds", "Request arrival to its last token", &out);
  queue_.Render("tessera_request_queue_seconds", "Request submitted to first scheduled", &out);
  prefill_.Render("tessera_request_prefill_seconds", "First scheduled to first token", &out);
  kv_transfer_.Render("tessera_pd_kv_transfer_seconds",
                      "Decode side: the prefill's end (its last burst) to the last KV block in",
                      &out);
  kv_handoff_.Render("tessera_pd_handoff_seconds",
                     "Decode side: the prefill's end (its last burst) to the first token", &out);
  decode_.Render("tessera_request_decode_seconds", "First token to finished", &out);
  Scalar("tessera_request_comm_seconds_total", "counter",
         "Requests' shares of their steps' communication time (parallel runs)",
         request_comm_seconds_, &out);
  Header("tessera_requests_total", "counter", "Finished requests by endpoint and finish reason",
         &out);
  for (const auto& [key, count] : requests_) {
    out += "tessera_requests_total{endpoint=\"" + key.first + "\",finish_reason=\"" + key.second +
           "\"} " + std::to_string(count) + "\n";
  }
  Header("tessera_http_errors_total", "counter", "Requests refused, by HTTP status", &out);
  for (const auto& [status, count] : http_errors_) {
    out += "tessera_http_errors_total{status=\"" + std::to_string(status) + "\"} " +
           std::to_string(count) + "\n";
  }
  Scalar("tessera_comm_seconds_total", "counter",
         "Seconds the driver rank spent communicating in steps", comm_.comm_seconds, &out);
  Header("tessera_comm_bytes_sent_total", "counter",
         "Bytes the driver rank sent, by communicator group", &out);
  for (const auto& [group, e] : comm_.by_group) {
    out += "tessera_comm_bytes_sent_total{group=\"" + group + "\"} " +
           std::to_string(e.bytes_sent) + "\n";
  }
  Header("tessera_comm_bytes_received_total", "counter",
         "Bytes the driver rank received, by communicator group", &out);
  for (const auto& [group, e] : comm_.by_group) {
    out += "tessera_comm_bytes_received_total{group=\"" + group + "\"} " +
           std::to_string(e.bytes_received) + "\n";
  }
  Header("tessera_comm_calls_total", "counter",
         "Communication operations of the driver rank, by communicator group", &out);
  for (const auto& [group, e] : comm_.by_group) {
    out += "tessera_comm_calls_total{group=\"" + group + "\"} " + std::to_string(e.calls) + "\n";
  }
  if (!comm_.expert_rows.empty()) {
    Header("tessera_expert_rows_total", "counter",
           "MoE (token, choice) rows routed to each expert (the driver's stage and EP group), "
           "with the EP rank it lives on (replicas from --ep-placement share its rows)",
           &out);
    const int64_t n = static_cast<int64_t>(comm_.expert_rows.size());
    std::vector<int64_t> per_rank(static_cast<size_t>(comm_.ep), 0);
    for (int64_t e = 0; e < n; ++e) {
      const int owner = static_cast<size_t>(e) < comm_.expert_home.size()
                            ? comm_.expert_home[static_cast<size_t>(e)]
                            : 0;
      per_rank[static_cast<size_t>(owner)] += comm_.expert_rows[static_cast<size_t>(e)];
      out += "tessera_expert_rows_total{expert=\"" + std::to_string(e) + "\",ep_rank=\"" +
             std::to_string(owner) + "\"} " +
             std::to_string(comm_.expert_rows[static_cast<size_t>(e)]) + "\n";
    }
    Header("tessera_ep_rank_rows_total", "counter",
           "MoE (token, choice) rows routed to the experts living on each EP rank (the "
           "driver's stage and group; with replicas, some ran on another rank)",
           &out);
    for (int q = 0; q < comm_.ep; ++q) {
      out += "tessera_ep_rank_rows_total{ep_rank=\"" + std::to_string(q) + "\"} " +
             std::to_string(per_rank[static_cast<size_t>(q)]) + "\n";
    }
  }
  if (!comm_.ep_rows_computed.empty()) {
    Header("tessera_ep_rank_rows_computed_total", "counter",
           "MoE (token, choice) rows each EP rank's experts computed, every group and stage "
           "(with replicas, the rank's real work; as of the last poll of the ranks)",
           &out);
    for (size_t q = 0; q < comm_.ep_rows_computed.size(); ++q) {
      out += "tessera_ep_rank_rows_computed_total{ep_rank=\"" + std::to_string(q) + "\"} " +
             std::to_string(comm_.ep_rows_computed[q]) + "\n";
    }
  }
  if (!comm_.expert_copies.empty()) {
    Header("tessera_expert_copies", "gauge",
           "Copies of each expert now, summed over the MoE layers (one a layer: no replica)", &out);
    for (size_t e = 0; e < comm_.expert_copies.size(); ++e) {
      out += "tessera_expert_copies{expert=\"" + std::to_string(e) + "\"} " +
             std::to_string(comm_.expert_copies[e]) + "\n";
    }
    Scalar("tessera_ep_rebalances_total", "counter",
           "Live expert re-placements applied (--ep-rebalance)",
           static_cast<double>(comm_.ep_rebalances), &out);
    Scalar("tessera_ep_rebalance_last_seconds", "gauge",
           "How long the last live expert re-placement held the engine",
           comm_.ep_rebalance_last_seconds, &out);
    Header("tessera_ep_busiest_over_mean", "gauge",
           "The last re-placement's window: the busiest EP rank's expected rows over the mean, "
           "under the placement it replaced and under the new one",
           &out);
    out +=
        "tessera_ep_busiest_over_mean{placement=\"before\"} " + Num(comm_.ep_busiest_before) + "\n";
    out +=
        "tessera_ep_busiest_over_mean{placement=\"after\"} " + Num(comm_.ep_busiest_after) + "\n";
  }
  return out;
}

std::string MergeReplicaMetrics(const std::vector<std::pair<int, std::string>>& replicas) {
  struct Family {
    std::string help;  // "# HELP …" line, "\n"-terminated
    std::string type;  // "# TYPE …" line
    std::string samples;
  };
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  auto family_of = [&](const std::string& name) -> Family& {
    auto [it, fresh] = families.try_emplace(name);
    if (fresh) order.push_back(name);
    return it->second;
  };
  for (const auto& [replica, text] : replicas) {
    const std::string label = "replica=\"" + std::to_string(replica) + "\"";
    std::string current;  // the family of the samples that follow
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      const std::string_view line(text.data() + begin, end - begin);
      begin = end + 1;
      if (line.empty()) continue;
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        const std::string_view rest = line.substr(7);
        current = std::string(rest.substr(0, rest.find(' ')));
        Family& family = family_of(current);
        std::string& slot = line[2] == 'H' ? family.help : family.type;
        if (slot.empty()) slot = std::string(line) + "\n";
        continue;
      }
      if (line[0] == '#') continue;  // other comments
      // A sample: name, optional {labels}, value (and optional timestamp).
      const size_t name_end = line.find_first_of("{ ");
      if (name_end == std::string_view::npos || name_end == 0) continue;
      const std::string_view name = line.substr(0, name_end);
      // _bucket/_sum/_count of the histogram (or summary) typed just before.
      const bool in_current = !current.empty() && name.starts_with(current);
      Family& family = family_of(in_current ? current : std::string(name));
      std::string sample(name);
      if (line[name_end] == '{') {
        sample += "{" + label + (line[name_end + 1] == '}' ? "" : ",");
        sample += line.substr(name_end + 1);
      } else {
        sample += "{" + label + "}";
        sample += line.substr(name_end);
      }
      family.samples += sample + "\n";
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& family = families.at(name);
    out += family.help + family.type + family.samples;
  }
  return out;
}

}  // namespace tessera::serve
