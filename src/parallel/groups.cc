#include "parallel/groups.h"

namespace tessera::parallel {

void Groups::Abort(const std::string& reason) {
  for (comm::Communicator* c : {tp.get(), pp.get(), ep.get(), cp.get(), ctl.get()}) {
    if (c != nullptr) c->Abort(reason);
  }
}

Result<Groups> MakeGroups(comm::Communicator& world, const Partition& plan) {
  if (world.size() != plan.world_size()) {
    return InvalidArgumentError("the plan (" + plan.ToString() + ") needs " +
                                std::to_string(plan.world_size()) + " ranks, the world has " +
                                std::to_string(world.size()));
  }
  const int rank = world.rank();
  Groups g;
  const int stage = plan.StageOf(rank), tp_rank = plan.TpRankOf(rank);
  const int cp_rank = plan.CpRankOf(rank);
  // tp innermost: rank / tp names the tp group.
  TESSERA_ASSIGN_OR_RETURN(g.tp, world.Split(rank / plan.tp, tp_rank));
  TESSERA_ASSIGN_OR_RETURN(g.pp, world.Split(plan.LaneOf(rank), stage));
  TESSERA_ASSIGN_OR_RETURN(g.ctl, world.Split(0, rank));
  if (plan.ep > 1) {
    TESSERA_ASSIGN_OR_RETURN(g.ep, world.Split(plan.EpGroupOf(rank), plan.EpRankOf(rank)));
  }
  if (plan.cp > 1) {
    TESSERA_ASSIGN_OR_RETURN(
        g.cp, world.Split((stage * plan.dp + plan.DpRankOf(rank)) * plan.tp + tp_rank, cp_rank));
  }
  return g;
}

}  // namespace tessera::parallel
