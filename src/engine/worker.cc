#include "engine/worker.h"

#include "base/check.h"

namespace tessera::engine {

Status ServeWorker(StageRunner& runner) {
  TESSERA_CHECK(!runner.is_driver());
  const Partition& plan = runner.plan();
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner.ReceiveStep(runner.upstream(), /*idle=*/true));
    if (m.kind != parallel::StepKind::kStep) {
      if (runner.stage() < plan.pp - 1) {
        TESSERA_RETURN_IF_ERROR(runner.SendStep(m, runner.downstream()));
      }
      if (m.kind == parallel::StepKind::kKvRead) {
        TESSERA_RETURN_IF_ERROR(runner.SendKvBlocks(m.kv_blocks, plan.driver_rank()));
        continue;
      }
      if (m.kind == parallel::StepKind::kKvWrite) {
        TESSERA_RETURN_IF_ERROR(runner.ReceiveKvBlocks(m.kv_blocks, plan.driver_rank()));
        continue;
      }
      if (m.kind == parallel::StepKind::kKvPrepare) {
        TESSERA_RETURN_IF_ERROR(runner.PrepareKvBlocksAhead(m.kv_blocks));
        continue;
      }
      if (m.kind == parallel::StepKind::kKvStream) {
        TESSERA_RETURN_IF_ERROR(runner.StreamKvLayersNextStep(m.kv_blocks));
        continue;
      }
      if (m.kind == parallel::StepKind::kPlacement) {
        TESSERA_ASSIGN_OR_RETURN(parallel::ExpertPlacement placement,
                                 parallel::PlacementFromInts(m.placement));
        TESSERA_RETURN_IF_ERROR(runner.SetExpertPlacement(placement));
      }
      TESSERA_RETURN_IF_ERROR(runner.SendReport(plan.driver_rank()));
      if (m.kind == parallel::StepKind::kStop) return Status::Ok();
      continue;
    }
    TESSERA_RETURN_IF_ERROR(runner.RunStep(m, nullptr));
  }
}

}  // namespace tessera::engine
