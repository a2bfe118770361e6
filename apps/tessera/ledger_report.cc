#include "apps/tessera/ledger_report.h"

#include <map>

namespace tessera::cli {

Result<std::string> FormatLedger(const model::GgufFile& file, const parallel::ParallelPlan& plan,
                                 bool deterministic,
                                 const std::vector<engine::RankReport>& reports) {
  std::string out = "ledger: bytes sent per rank, per step (max over ranks)\n";
  if (reports.empty()) return out;
  const std::vector<engine::StepTraffic>& steps = reports[0].traffic;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::map<std::string, uint64_t> sent;
    for (const engine::RankReport& r : reports) {
      if (i >= r.traffic.size()) continue;
      for (const auto& [key, e] : r.traffic[i].bytes) sent[key] = std::max(sent[key], e.bytes_sent);
    }
    out += "step " + std::to_string(steps[i].step_id) + (steps[i].decode ? " decode" : " prefill");
    for (const auto& [key, bytes] : sent) out += "  " + key + " " + std::to_string(bytes);
    out += "\n";
  }
  return out;
}

}  // namespace tessera::cli
