#include "serve/metered_executor.h"

namespace tessera::serve {

Result<std::span<const float>> MeteredExecutor::Collect() {
  Result<std::span<const float>> logits = inner_.Collect();
  comm_seconds_ += inner_.last_step_comm_seconds();
  CommTotals totals;
  totals.comm_seconds = comm_seconds_;
  if (groups_.tp) totals.by_group["tp"] = groups_.tp->ledger().Total();
  if (groups_.pp) totals.by_group["pp"] = groups_.pp->ledger().Total();
  if (groups_.ctl) totals.by_group["ctl"] = groups_.ctl->ledger().Total();
  if (groups_.ep) totals.by_group["ep"] = groups_.ep->ledger().Total();
  if (runner_ != nullptr) {
    totals.expert_rows = runner_->expert_rows_total();
    totals.ep = runner_->plan().ep;
  }
  metrics_.SetComm(std::move(totals));
  return logits;
}

}  // namespace tessera::serve
