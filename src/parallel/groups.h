// Groups: the communicators of a Partition, split from the world — the tensor-
// parallel group of each stage, the pipeline group of each tp rank, the expert-
// parallel group (ep > 1) inside a stage's tp ranks (or its dp ranks), the context-parallel group
// (cp > 1) of the stage's ranks with one tp rank, and "ctl", a
// copy of the world for the driver's step messages (so their bytes are counted
// apart from the model's data in the ledger). Layer: parallel.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "comm/communicator.h"
#include "parallel/partition.h"

namespace tessera::parallel {

struct Groups {
  std::unique_ptr<comm::Communicator> tp;   // this stage's tp ranks, by tp rank
  std::unique_ptr<comm::Communicator> pp;   // the stages' ranks with this tp rank, by stage
  std::unique_ptr<comm::Communicator> ctl;  // the world again, by world rank
  // ep > 1: this rank's EP group, ep consecutive tp ranks of its stage (under
  // data-parallel attention: the stage's dp ranks), by EP rank.
  std::unique_ptr<comm::Communicator> ep;
  // cp > 1: the stage's ranks with this tp rank, one per cp rank, by cp rank.
  std::unique_ptr<comm::Communicator> cp;
  // Makes every group's current and later operations fail and wakes the peers
  // waiting on this rank (a peer is gone, or this rank failed).
  void Abort(const std::string& reason);
};

// Every rank of `world` calls it (collective). InvalidArgument when the world's
// size is not the plan's.
Result<Groups> MakeGroups(comm::Communicator& world, const Partition& plan);

}  // namespace tessera::parallel
