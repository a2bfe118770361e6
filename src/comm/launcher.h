// LaunchLocalRanks: the core of `tessera launch` (and of `tessera bench comm`,
// which launches itself). Starts this node's ranks with the torchrun-style
// environment, hosts the TCP rendezvous store on node 0, waits, and when one
// rank fails terminates the others. Removes the job's leftover shared-memory
// names on exit (a rank killed during setup cannot unlink its own). Layer: comm.
// Call from a single-threaded process (it forks).
#pragma once

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "comm/net_util.h"

namespace tessera::comm {

struct LaunchSpec {
  std::vector<std::string> argv;  // the command each rank runs
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  // Rendezvous address; empty host = local job (an ephemeral port on 127.0.0.1).
  HostPort rdzv;
  std::string cluster_token;
  // Let the job listen beyond loopback without a token (comm/exposure.h).
  bool insecure_no_token = false;
  std::string job_id;  // empty = random (node 0) / fetched from node 0's store
  std::vector<std::pair<std::string, std::string>> extra_env;
  int grace_ms = 3000;  // SIGTERM → SIGKILL delay when tearing down
  // Supervision: when a rank other than the driver (local rank
  // `driver_local_rank`, which holds the service) fails, or the driver asks with
  // kRestartRequestSignal, the other ranks are killed and started again at the
  // next epoch (TESSERA_EPOCH), at most max_restarts times; the driver hears of
  // each new epoch by kEpochStartedSignal. 0 = a failing rank stops the job.
  // Across nodes, the driver's node decides: it publishes each epoch on the
  // rendezvous store, and the launchers of the other nodes (driver_local_rank
  // -1) replace their ranks when it moves on, report their ranks' failures, and,
  // started again after their node was lost, join the current epoch.
  int max_restarts = 0;
  int driver_local_rank = 0;
};

// Supervised jobs: the driver rank sends kRestartRequestSignal to the launcher
// (sigqueue, value: the epoch that failed); the launcher sends
// kEpochStartedSignal to the driver (value: the epoch whose ranks it started).
inline constexpr int kRestartRequestSignal = SIGUSR1;
inline constexpr int kEpochStartedSignal = SIGUSR2;

// Returns the job's exit code: 0 when every rank exited 0, else the first
// failing rank's code (128 + signal for a signal) that supervision did not
// absorb.
Result<int> LaunchLocalRanks(const LaunchSpec& spec);

// Unlinks /dev/shm/tessera-<job>-* (names that a crashed rank left behind).
int RemoveJobSharedMemory(const std::string& job_id);

}  // namespace tessera::comm
