#include "serve/metered_executor.h"

#include <cstdio>
#include <optional>

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

Status MeteredExecutor::ReadKvBlocks(std::span<const int32_t> blocks, uint8_t* out) {
  Status read = inner_.ReadKvBlocks(blocks, out);
  metrics_.SetComm(Totals());
  return read;
}

Status MeteredExecutor::WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) {
  Status written = inner_.WriteKvBlocks(blocks, in);
  metrics_.SetComm(Totals());
  return written;
}

bool MeteredExecutor::PollDue() const {
  return driver_ != nullptr && NowNs() - last_poll_ns_ >= poll_interval_ns_;
}

Status MeteredExecutor::PollReports() {
  if (driver_ == nullptr) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(std::vector<engine::RankReport> reports, driver_->PollReports());
  last_poll_ns_ = NowNs();
  if (runner_ != nullptr && runner_->plan().ep > 1) {
    const parallel::Partition& plan = runner_->plan();
    ep_rows_computed_.assign(static_cast<size_t>(plan.ep), 0);
    for (const engine::RankReport& r : reports) {
      ep_rows_computed_[static_cast<size_t>(plan.EpRankOf(r.rank))] += r.expert_rows_computed;
    }
  }
  std::optional<parallel::ExpertPlacement> next;
  if (rebalancer_ != nullptr) next = rebalancer_->Consider(reports, last_poll_ns_);
  metrics_.SetRanks(std::move(reports), last_poll_ns_);
  if (next) {
    const int64_t start = NowNs();
    TESSERA_RETURN_IF_ERROR(driver_->SetExpertPlacement(*next).status());
    rebalancer_->Applied(*next, static_cast<double>(NowNs() - start) * 1e-9);
    SummarisePlacement();
    const engine::RebalanceStats& s = rebalancer_->stats();
    int64_t copies = 0, layers = 0;  // a summary: a large model's tables run to kilobytes
    const std::vector<parallel::ExpertHolders> tables =
        next->per_layer() ? next->layers : std::vector<parallel::ExpertHolders>{next->holders};
    for (const parallel::ExpertHolders& table : tables) {
      ++layers;
      for (const std::vector<int>& holders : table) {
        copies += static_cast<int64_t>(holders.size()) - 1;
      }
    }
    std::fprintf(stderr,
                 "tessera serve: experts re-placed for the last window's load in %.1f ms: the "
                 "busiest EP rank's expected rows %.2fx -> %.2fx the mean; %lld copies over %lld "
                 "layer table%s\n",
                 s.last_seconds * 1e3, s.before_ratio, s.after_ratio,
                 static_cast<long long>(copies), static_cast<long long>(layers),
                 layers == 1 ? "" : "s");
  }
  metrics_.SetComm(Totals());  // the polled rows computed per EP rank, the placement
  return Status::Ok();
}

void MeteredExecutor::SetRunner(const engine::StageRunner* runner) {
  runner_ = runner;
  SummarisePlacement();
}

void MeteredExecutor::SummarisePlacement() {
  expert_home_.clear();
  expert_copies_.clear();
  if (runner_ == nullptr || runner_->plan().ep < 2) return;
  // Homes from the driver stage's first layer (BalanceExperts keeps them at home in
  // every layer); copies summed over the model's layers.
  const parallel::Partition& plan = runner_->plan();
  const parallel::ExpertPlacement& placement = plan.expert_placement;
  for (const std::vector<int>& holders : placement.Of(plan.stage_layers.back().begin)) {
    expert_home_.push_back(holders.empty() ? 0 : holders[0]);
  }
  expert_copies_.assign(expert_home_.size(), 0);
  for (int64_t l = 0; l < plan.stage_layers.back().end; ++l) {
    const parallel::ExpertHolders& table = placement.Of(l);
    for (size_t e = 0; e < table.size() && e < expert_copies_.size(); ++e) {
      expert_copies_[e] += static_cast<int>(table[e].size());
    }
  }
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
    totals.expert_home = expert_home_;
    totals.expert_copies = expert_copies_;
    if (totals.ep_rows_computed.size() < ep_rows_computed_.size()) {
      totals.ep_rows_computed.resize(ep_rows_computed_.size(), 0);
    }
    for (size_t q = 0; q < ep_rows_computed_.size(); ++q) {
      totals.ep_rows_computed[q] += ep_rows_computed_[q];
    }
  }
  if (rebalancer_ != nullptr) {
    const engine::RebalanceStats& s = rebalancer_->stats();
    totals.ep_rebalances += s.rebalances;
    if (s.rebalances > 0) {
      totals.ep_rebalance_last_seconds = s.last_seconds;
      totals.ep_busiest_before = s.before_ratio;
      totals.ep_busiest_after = s.after_ratio;
    }
  }
  return totals;
}

}  // namespace tessera::serve
