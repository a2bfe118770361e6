#include "serve/ui_state.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

namespace tessera::serve {
namespace {

using nlohmann::json;

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// Decode and prefill steps together: where the rank's step time went.
engine::TimeShare Sum(const engine::RankReport& r) {
  return {.steps = r.decode.steps + r.prefill.steps,
          .compute_ns = r.decode.compute_ns + r.prefill.compute_ns,
          .comm_ns = r.decode.comm_ns + r.prefill.comm_ns,
          .wait_ns = r.decode.wait_ns + r.prefill.wait_ns};
}

json ShareJson(const engine::TimeShare& t) {
  return {{"steps", t.steps},
          {"compute_s", Seconds(t.compute_ns)},
          {"comm_s", Seconds(t.comm_ns)},
          {"wait_s", Seconds(t.wait_ns)}};
}

// The value at quantile q of sorted values (nearest rank), null when empty.
json Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return nullptr;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
  return sorted[i];
}

json RanksJson(const LiveView& live) {
  json ranks = json::array();
  const std::vector<engine::RankReport>& now = live.ranks.reports;
  const std::vector<engine::RankReport>& before = live.ranks_before.reports;
  const bool comparable = live.ranks_before.at_ns > 0 && before.size() == now.size();
  for (size_t i = 0; i < now.size(); ++i) {
    const engine::RankReport& r = now[i];
    const engine::TimeShare total = Sum(r);
    json interval = nullptr;
    if (comparable) {
      const engine::TimeShare old = Sum(before[i]);
      const engine::TimeShare d{.steps = total.steps - old.steps,
                                .compute_ns = total.compute_ns - old.compute_ns,
                                .comm_ns = total.comm_ns - old.comm_ns,
                                .wait_ns = total.wait_ns - old.wait_ns};
      // Counters that went back belong to a restarted rank: nothing to compare.
      if (d.steps >= 0 && d.compute_ns >= 0 && d.comm_ns >= 0 && d.wait_ns >= 0) {
        interval = ShareJson(d);
        interval["seconds"] = Seconds(live.ranks.at_ns - live.ranks_before.at_ns);
      }
    }
    ranks.push_back({{"rank", r.rank},
                     {"stage", r.stage},
                     {"tp_rank", r.tp_rank},
                     {"links", r.links},
                     {"weight_bytes", r.weight_bytes},
                     {"kv_bytes", r.kv_bytes},
                     {"peak_rss_bytes", r.peak_rss_bytes},
                     {"total", ShareJson(total)},
                     {"interval", interval}});
  }
  return ranks;
}

// The tensor-parallel group of each stage and the pipeline of each tp rank.
json GroupsJson(const std::vector<engine::RankReport>& reports) {
  std::map<int, std::vector<int>> tp, pp;
  for (const engine::RankReport& r : reports) {
    tp[r.stage].push_back(r.rank);
    pp[r.tp_rank].push_back(r.rank);
  }
  json groups = json::array();
  if (reports.size() <= 1) return groups;
  for (const auto& [stage, ranks] : tp) {
    if (ranks.size() > 1) groups.push_back({{"kind", "tp"}, {"index", stage}, {"ranks", ranks}});
  }
  for (const auto& [tp_rank, ranks] : pp) {
    if (ranks.size() > 1) groups.push_back({{"kind", "pp"}, {"index", tp_rank}, {"ranks", ranks}});
  }
  return groups;
}

// Per group and primitive: the ranks' calls and bytes summed, and each rank's bytes sent.
json LedgerJson(const std::vector<engine::RankReport>& reports) {
  struct Row {
    comm::LedgerEntry sum;
    std::vector<uint64_t> sent_by_rank;
  };
  std::map<std::string, Row> rows;
  for (size_t i = 0; i < reports.size(); ++i) {
    for (const auto& [key, e] : reports[i].ledger) {
      Row& row = rows[key];
      row.sent_by_rank.resize(reports.size(), 0);
      row.sum.calls += e.calls;
      row.sum.bytes_sent += e.bytes_sent;
      row.sum.bytes_received += e.bytes_received;
      row.sent_by_rank[i] = e.bytes_sent;
    }
  }
  json ledger = json::array();
  for (const auto& [key, row] : rows) {
    const size_t slash = key.find('/');
    ledger.push_back({{"group", key.substr(0, slash)},
                      {"primitive", slash == std::string::npos ? "" : key.substr(slash + 1)},
                      {"calls", row.sum.calls},
                      {"bytes_sent", row.sum.bytes_sent},
                      {"bytes_received", row.sum.bytes_received},
                      {"bytes_sent_by_rank", row.sent_by_rank}});
  }
  return ledger;
}

json LatencyJson(const std::vector<RecentRequest>& recent, int64_t now_ns) {
  const int64_t num_buckets = Metrics::kRecentWindowNs / kUiBucketNs;
  struct Bucket {
    int64_t requests = 0;
    double ttft_sum = 0, ttft_max = 0, tpot_sum = 0;
    int64_t ttft_n = 0, tpot_n = 0;
  };
  std::vector<Bucket> buckets(static_cast<size_t>(num_buckets));
  std::vector<double> ttft, tpot, e2e;  // the last minute
  for (const RecentRequest& r : recent) {
    const int64_t age = now_ns - r.finished_ns;
    if (age < 0 || age >= Metrics::kRecentWindowNs) continue;
    Bucket& b = buckets[static_cast<size_t>(num_buckets - 1 - age / kUiBucketNs)];
    ++b.requests;
    if (r.ttft_s >= 0) {
      b.ttft_sum += r.ttft_s;
      b.ttft_max = std::max(b.ttft_max, r.ttft_s);
      ++b.ttft_n;
    }
    if (r.tpot_s >= 0) {
      b.tpot_sum += r.tpot_s;
      ++b.tpot_n;
    }
    if (age < int64_t{60} * 1'000'000'000) {
      if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
      if (r.tpot_s >= 0) tpot.push_back(r.tpot_s);
      e2e.push_back(r.e2e_s);
    }
  }
  json series = json::array();
  for (int64_t i = 0; i < num_buckets; ++i) {
    const Bucket& b = buckets[static_cast<size_t>(i)];
    series.push_back({{"start_s", -(num_buckets - i) * (kUiBucketNs / 1'000'000'000)},
                      {"requests", b.requests},
                      {"ttft_mean_s", b.ttft_n > 0 ? json(b.ttft_sum / b.ttft_n) : json()},
                      {"ttft_max_s", b.ttft_n > 0 ? json(b.ttft_max) : json()},
                      {"tpot_mean_s", b.tpot_n > 0 ? json(b.tpot_sum / b.tpot_n) : json()}});
  }
  for (std::vector<double>* v : {&ttft, &tpot, &e2e}) std::sort(v->begin(), v->end());
  return {{"bucket_s", Seconds(kUiBucketNs)},
          {"window_s", Seconds(Metrics::kRecentWindowNs)},
          {"buckets", series},
          {"last_minute",
           {{"requests", e2e.size()},
            {"ttft_p50_s", Quantile(ttft, 0.5)},
            {"ttft_p90_s", Quantile(ttft, 0.9)},
            {"tpot_p50_s", Quantile(tpot, 0.5)},
            {"tpot_p90_s", Quantile(tpot, 0.9)},
            {"e2e_p50_s", Quantile(e2e, 0.5)}}}};
}

}  // namespace

std::string UiStateJson(const UiDeployment& deployment, const engine::SchedulerStats& s,
                        const LiveView& live, int64_t now_ns) {
  json state;
  state["model"] = deployment.model_name;
  state["plan"] = deployment.plan;
  state["uptime_s"] = Seconds(now_ns - deployment.started_ns);
  state["max_model_len"] = deployment.max_model_len;
  state["kv_block_size"] = deployment.kv_block_size;
  state["scheduler"] = {
      {"running", s.running},
      {"waiting", s.waiting},
      {"kv_blocks_used", s.kv_blocks_used},
      {"kv_blocks_total", s.kv_blocks_total},
      {"kv_blocks_cached", s.kv_blocks_cached},
      {"kv_usage", s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) /
                                               static_cast<double>(s.kv_blocks_total)
                                         : 0.0},
      {"prompt_tokens_total", s.prompt_tokens_total},
      {"generation_tokens_total", s.generation_tokens_total},
      {"requests_finished_total", s.requests_finished_total},
      {"preemptions_total", s.preemptions_total},
      {"steps_total", s.steps_total},
      {"prefix_cache_hit_tokens_total", s.prefix_cache_hit_tokens_total},
      {"prefix_cache_query_tokens_total", s.prefix_cache_query_tokens_total},
      {"recovering", s.recovering},
      {"engine_restarts_total", s.engine_restarts_total}};
  state["ranks"] = RanksJson(live);
  state["ranks_age_s"] =
      live.ranks.at_ns > 0 ? json(Seconds(now_ns - live.ranks.at_ns)) : json(nullptr);
  state["groups"] = GroupsJson(live.ranks.reports);
  state["ledger"] = LedgerJson(live.ranks.reports);
  state["comm_seconds_total"] = live.comm.comm_seconds;
  state["latency"] = LatencyJson(live.recent, now_ns);
  return state.dump();
}

}  // namespace tessera::serve
