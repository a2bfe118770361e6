#include "apps/tessera/ledger_report.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "apps/tessera/plan_inputs.h"
#include "engine/expert_rebalancer.h"
#include "model/shard.h"
#include "plan/presets.h"
#include "plan/traffic.h"

namespace tessera::cli {
namespace {

std::string Bytes(double b) {
  char buf[32];
  if (b >= (1 << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", b);
  }
  return buf;
}

// Whether rank `rank`'s tensor-parallel group (ranks rank - rank % tp … + tp - 1,
// tp fastest in the world order) has a TCP link; `links` is its RankReport's
// transport to each world rank.
bool TpGroupUsesTcp(const std::string& links, int rank, int tp) {
  const int first = rank - rank % tp;
  std::istringstream words(links);
  std::string link;
  for (int q = 0; words >> link && q < first + tp; ++q) {
    if (q >= first && link == "tcp") return true;
  }
  return false;
}

bool Differs(double a, double b) { return std::abs(a - b) > 0.01 * std::max(std::abs(b), 1.0); }

}  // namespace

std::string ExpertLoadLine(const std::vector<engine::RankReport>& reports,
                           std::optional<size_t> step, const parallel::Partition& plan) {
  const std::vector<int64_t> per_expert = engine::ExpertLoad(reports, step, plan);
  // What each EP rank's experts computed (with replicas, not just its home experts'
  // rows), summed over its groups and stages.
  std::vector<int64_t> per_ep_rank(static_cast<size_t>(plan.ep), 0);
  for (const engine::RankReport& r : reports) {
    int64_t computed = r.expert_rows_computed;
    if (step) computed = *step < r.traffic.size() ? r.traffic[*step].expert_rows_computed : 0;
    per_ep_rank[static_cast<size_t>(plan.EpRankOf(r.rank))] += computed;
  }
  std::string line = "ep load, (token, choice) rows per expert:";
  for (int64_t rows : per_expert) line += " " + std::to_string(rows);
  line += "; computed per ep rank:";
  int64_t total = 0, most = 0;
  for (int64_t v : per_ep_rank) {
    line += " " + std::to_string(v);
    total += v;
    most = std::max(most, v);
  }
  if (total > 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " (max/mean %.2f)",
                  static_cast<double>(most) * plan.ep / static_cast<double>(total));
    line += buf;
  }
  return line;
}

namespace {

// The planner's pass for a recorded step. Under context parallelism the planner
// models uniform steps: a whole prompt's prefill (every sequence from position 0,
// the same length) or a decode at one context length.
Result<plan::Pass> LedgerPass(const engine::StepTraffic& step, int cp) {
  if (cp == 1 && step.sequences == 0) {  // a dp rank's padding step: nothing of its own
    plan::Pass pass;
    pass.phase = step.decode ? plan::Phase::kDecode : plan::Phase::kPrefill;
    pass.num_seqs = 0;
    pass.total_tokens = 0;
    pass.logit_rows = 0;
    return pass;
  }
  if (cp == 1) return plan::StepPass(step.sequences, step.tokens, step.logit_rows);
  if (step.sequences < 1 || step.tokens % step.sequences != 0 ||
      step.context % step.sequences != 0 || (!step.decode && step.context != 0)) {
    return InvalidArgumentError(
        "a cp step of sequences with different lengths or positions, or a prefill chunk after "
        "the first, runs every row on every cp rank");
  }
  plan::Pass pass;
  pass.phase = step.decode ? plan::Phase::kDecode : plan::Phase::kPrefill;
  pass.num_seqs = step.sequences;
  pass.tokens_per_seq = step.tokens / step.sequences;
  pass.context = step.context / step.sequences;
  pass.logit_rows = step.logit_rows;
  return pass;
}

}  // namespace

Result<std::string> FormatLedger(const model::GgufFile& file, const parallel::Partition& plan,
                                 bool deterministic, const std::string& kv_type,
                                 const std::vector<engine::RankReport>& reports) {
  TESSERA_ASSIGN_OR_RETURN(plan::ModelShape shape, ModelShapeFromGguf(file, file.name()));
  // Only the byte counts are used: any cluster will do.
  TESSERA_ASSIGN_OR_RETURN(plan::Cluster cluster, plan::ClusterPreset("8xh100"));
  plan::Workload workload;
  if (deterministic) workload.allreduce_algo = plan::AllReduceAlgo::kDeterministic;
  TESSERA_ASSIGN_OR_RETURN(workload.kv_dtype, plan::ParseDType(kv_type));
  // comm's one-shot all-reduce needs every rank of the group on shared memory:
  // without it (a TCP link in the job), predict what comm then runs.
  plan::Workload tcp_workload = workload;
  tcp_workload.allreduce_oneshot_bytes = 0;
  const plan::Parallelism p{.tp = plan.tp,
                            .pp = plan.pp,
                            .dp = plan.dp,
                            .ep = plan.ep,
                            .cp = plan.cp,
                            .sp = plan.sp ? plan.sp_min_tokens : 0};

  std::string out =
      "communication ledger: per step and per group/primitive, the bytes each rank sent and "
      "received (largest rank shown), next to plan/'s exact prediction for every rank and the "
      "seeds' formula. '!!' marks a difference above 1%.\n";
  if (reports.empty() || reports[0].traffic.empty()) return out + "(no steps recorded)\n";
  int64_t mismatches = 0;
  std::map<std::string, bool> explained;  // notes are printed once
  uint64_t total_sent = 0;
  const size_t num_steps = reports[0].traffic.size();
  for (size_t i = 0; i < num_steps; ++i) {
    // Under data-parallel attention each rank records its own share: the step is
    // their sum, and each rank is modelled on its share.
    engine::StepTraffic step = reports[0].traffic[i];
    if (plan.dp > 1) {
      step.sequences = step.tokens = step.context = step.logit_rows = 0;
      for (const engine::RankReport& r : reports) {
        if (i >= r.traffic.size()) continue;
        step.sequences += r.traffic[i].sequences;
        step.tokens += r.traffic[i].tokens;
        step.context += r.traffic[i].context;
        step.logit_rows += r.traffic[i].logit_rows;
      }
    }
    Result<plan::Pass> modelled = LedgerPass(step, plan.cp);
    if (!modelled.ok()) {
      out += "  (not modelled: " + modelled.status().message() + ")\n";
      continue;
    }
    const plan::Pass pass = *modelled;
    char head[160];
    std::snprintf(head, sizeof(head), "step %llu %s: %lld sequence%s, %lld new token%s\n",
                  static_cast<unsigned long long>(step.step_id), step.decode ? "decode" : "prefill",
                  static_cast<long long>(step.sequences), step.sequences == 1 ? "" : "s",
                  static_cast<long long>(step.tokens), step.tokens == 1 ? "" : "s");
    out += head;
    // Measured and predicted, per key: the largest rank, and whether any rank differs.
    struct Row {
      uint64_t calls = 0, sent = 0, received = 0;
      int64_t model_sent = 0, model_received = 0;
      bool differs = false;
    };
    std::map<std::string, Row> rows;
    for (const engine::RankReport& r : reports) {
      if (i >= r.traffic.size()) continue;
      const bool tcp = TpGroupUsesTcp(r.links, r.rank, plan.tp);
      plan::Pass rank_pass = pass;
      if (plan.dp > 1) {
        TESSERA_ASSIGN_OR_RETURN(rank_pass, LedgerPass(r.traffic[i], plan.cp));
        rank_pass.peer_logit_rows = step.logit_rows - r.traffic[i].logit_rows;
      }
      if (plan.ep > 1) {
        rank_pass.expert_rows = plan::ExpertRows{.sent = r.traffic[i].ep_rows_sent,
                                                 .received = r.traffic[i].ep_rows_received};
      }
      const auto predicted = plan::PredictLedger(
          plan::RankCalls(shape, cluster, tcp ? tcp_workload : workload, p, rank_pass, r.rank));
      std::map<std::string, bool> seen;
      for (const auto& [key, e] : r.traffic[i].bytes) {
        Row& row = rows[key];
        row.calls = std::max(row.calls, e.calls);
        row.sent = std::max(row.sent, e.bytes_sent);
        row.received = std::max(row.received, e.bytes_received);
        total_sent += e.bytes_sent;
        auto it = predicted.find(key);
        const plan::RankBytes model = it == predicted.end() ? plan::RankBytes{} : it->second.bytes;
        row.differs |=
            Differs(static_cast<double>(e.bytes_sent), static_cast<double>(model.sent)) ||
            Differs(static_cast<double>(e.bytes_received), static_cast<double>(model.received));
        seen[key] = true;
      }
      for (const auto& [key, entry] : predicted) {
        Row& row = rows[key];
        row.model_sent = std::max(row.model_sent, entry.bytes.sent);
        row.model_received = std::max(row.model_received, entry.bytes.received);
        if (!seen.count(key)) row.differs = true;  // predicted, never measured
      }
    }
    for (const auto& [key, row] : rows) {
      char line[256];
      std::snprintf(
          line, sizeof(line),
          "  %-16s %3llu calls  sent %10s  received %10s | model %10s / %10s %s\n", key.c_str(),
          static_cast<unsigned long long>(row.calls), Bytes(static_cast<double>(row.sent)).c_str(),
          Bytes(static_cast<double>(row.received)).c_str(),
          Bytes(static_cast<double>(row.model_sent)).c_str(),
          Bytes(static_cast<double>(row.model_received)).c_str(), row.differs ? "!!" : "ok");
      out += line;
      mismatches += row.differs ? 1 : 0;
    }
    if (plan.ep > 1) out += "  " + ExpertLoadLine(reports, i, plan) + "\n";
    // The seeds' simpler formulas for the same step, per item of the model.
    // Under data-parallel attention the planner's pass is one dp rank's share: the
    // seeds' figures are for the driver's.
    Result<plan::Pass> seeds_pass = plan.dp > 1 ? LedgerPass(reports[0].traffic[i], plan.cp) : pass;
    if (!seeds_pass.ok() || seeds_pass->num_seqs == 0) continue;
    for (const plan::CommItem& item :
         plan::PassCommItems(shape, cluster, workload, p, *seeds_pass)) {
      if (item.seed_formula.empty()) continue;
      const double exact = static_cast<double>(item.max_rank.sent);
      std::string line = "    seeds, " + item.group + " " + item.what + ": " + item.seed_formula +
                         " = " + Bytes(item.seed_bytes) + " vs exact " + Bytes(exact) +
                         " sent by the busiest rank";
      if (Differs(exact, item.seed_bytes)) {
        const std::string note = item.note.empty() ? std::string("differs") : item.note;
        line += explained[note] ? " !! (as explained above)" : " !! " + note;
        explained[note] = true;
      }
      out += line + "\n";
    }
  }
  char tail[200];
  std::snprintf(tail, sizeof(tail),
                "%zu steps, %s sent by all ranks; measured vs model: %lld difference%s above 1%%\n",
                num_steps, Bytes(static_cast<double>(total_sent)).c_str(),
                static_cast<long long>(mismatches), mismatches == 1 ? "" : "s");
  return out + tail;
}

}  // namespace tessera::cli
