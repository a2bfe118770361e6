#include "serve/metered_executor.h"

#include "base/clock.h"

namespace tessera::serve {

Result<std::span<const float>> MeteredExecutor::Collect() {
  Result<std::span<const float>> logits = inner_.Collect();
  comm_seconds_ += inner_.last_step_comm_seconds();
  metrics_.SetComm(Totals());
  if (logits.ok() && PollDue() && driver_->steps_in_flight() == 0) {
    TESSERA_RETURN_IF_ERROR(PollReports());
  }
  return logits;
}

bool MeteredExecutor::PollDue() const {
  return driver_ != nullptr && NowNs() - last_poll_ns_ >= poll_interval_ns_;
}

Status MeteredExecutor::PollReports() {
  if (driver_ == nullptr) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(std::vector<engine::RankReport> reports, driver_->PollReports());
  last_poll_ns_ = NowNs();
  metrics_.SetRanks(std::move(reports), last_poll_ns_);
  return Status::Ok();
}

CommTotals MeteredExecutor::Totals() const {
  CommTotals totals = carried_;
  totals.comm_seconds += comm_seconds_;
  auto add = [&](const char* name, const comm::Communicator* comm) {
    if (comm == nullptr) return;
    const comm::LedgerEntry now = comm->ledger().Total();
    comm::LedgerEntry& sum = totals.by_group[name];
    sum.calls += now.calls;
    sum.bytes_sent += now.bytes_sent;
    sum.bytes_received += now.bytes_received;
  };
  add("tp", groups_.tp.get());
  add("pp", groups_.pp.get());
  add("ctl", groups_.ctl.get());
  add("ep", groups_.ep.get());
  if (runner_ != nullptr) {
    const std::vector<int64_t>& rows = runner_->expert_rows_total();
    if (totals.expert_rows.size() < rows.size()) totals.expert_rows.resize(rows.size(), 0);
    for (size_t e = 0; e < rows.size(); ++e) totals.expert_rows[e] += rows[e];
    totals.ep = runner_->plan().ep;
    totals.expert_home.clear();
    for (const std::vector<int>& holders : runner_->plan().expert_placement.holders) {
      totals.expert_home.push_back(holders.empty() ? 0 : holders[0]);
    }
  }
  return totals;
}

}  // namespace tessera::serve
