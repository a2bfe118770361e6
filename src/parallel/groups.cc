#include "parallel/groups.h"

namespace tessera::parallel {

void Groups::Abort(const std::string& reason) {
  for (comm::Communicator* c : {tp.get(), pp.get(), ep.get(), ctl.get()}) {
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
  TESSERA_ASSIGN_OR_RETURN(g.tp, world.Split(plan.StageOf(rank), plan.TpRankOf(rank)));
  TESSERA_ASSIGN_OR_RETURN(g.pp, world.Split(plan.TpRankOf(rank), plan.StageOf(rank)));
  TESSERA_ASSIGN_OR_RETURN(g.ctl, world.Split(0, rank));
  if (plan.ep > 1) {
    TESSERA_ASSIGN_OR_RETURN(g.ep, world.Split(plan.EpGroupOf(rank), plan.EpRankOf(rank)));
  }
  return g;
}

}  // namespace tessera::parallel
