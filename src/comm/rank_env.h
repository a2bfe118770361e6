// Where a rank learns who it is: the launcher's environment. `tessera launch`
// and torchrun set RANK/WORLD_SIZE/LOCAL_RANK/… and the rendezvous address;
// mpirun sets OMPI_COMM_WORLD_*; MPICH/Intel MPI set PMI_*; srun sets SLURM_*.
// InitWorld turns that into a connected world communicator. Layer: comm.
// Thread-safe (reads the environment only).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/net_util.h"
#include "comm/options.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {

struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string source = "none";           // "tessera", "torchrun", "openmpi", "pmi", "slurm", "none"
  std::optional<HostPort> rdzv;          // TESSERA_RDZV or MASTER_ADDR:MASTER_PORT
  bool store_hosted_externally = false;  // the launcher runs the store
  std::string job_id;                    // from the launcher, or derived from MPI/Slurm ids
  // Supervised jobs (`tessera serve` over local ranks): how many times the
  // launcher restarted the ranks (TESSERA_EPOCH), and the launcher's pid
  // (TESSERA_SUPERVISOR_PID; 0 = not supervised). Each epoch rendezvouses under
  // its own store keys and shared-memory names (EpochJobId names its
  // communicators).
  int epoch = 0;
  int supervisor_pid = 0;
};

// The job id of one epoch: `job_id` itself for epoch 0.
std::string EpochJobId(const std::string& job_id, int epoch);

// Reads the first launcher environment present (in the order above). A
// malformed value is InvalidArgument; no launcher at all is a world of one.
Result<RankEnv> RankEnvFromEnvironment();

// A world communicator with what keeps it alive (the store, and the store
// server when this rank hosts it).
struct World {
  std::unique_ptr<TcpStoreServer> store_server;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};

// Rendezvous: with an address, rank 0 hosts the TCP store there unless the
// launcher does, and everyone connects with TESSERA_CLUSTER_TOKEN; without one,
// under MPI (an MPI launcher and an MPI build), rank 0 hosts it on a port of its
// own and tells the others through MPI_Bcast (address and a fresh token);
// otherwise ranks share a FileStore in TESSERA_STORE_DIR (default
// /tmp/tessera-store-<job>; setting it also keeps MPI out of the rendezvous).
Result<World> InitWorld(const RankEnv& env, CommOptions options);

}  // namespace tessera::comm
