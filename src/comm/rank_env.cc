#include "comm/rank_env.h"

#include <charconv>

#include "base/env.h"
#include "base/log.h"
#include "comm/exposure.h"
#include "comm/rendezvous/file_store.h"
#include "comm/transport/mpi_channel.h"

namespace tessera::comm {
namespace {

Result<int> ParseInt(const char* name, const std::string& text) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgumentError(std::string(name) + "='" + text + "' is not an integer");
  }
  return value;
}

Result<int> IntOr(const char* name, int fallback) {
  auto text = EnvString(name);
  if (!text) return fallback;
  return ParseInt(name, *text);
}

}  // namespace

Result<RankEnv> RankEnvFromEnvironment() {
  RankEnv env;
  struct Scheme {
    const char* source;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  const Scheme schemes[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Scheme& s : schemes) {
    if (!EnvString(s.rank) || !EnvString(s.size)) continue;
    env.source = s.source;
    TESSERA_ASSIGN_OR_RETURN(env.rank, ParseInt(s.rank, *EnvString(s.rank)));
    TESSERA_ASSIGN_OR_RETURN(env.world_size, ParseInt(s.size, *EnvString(s.size)));
    TESSERA_ASSIGN_OR_RETURN(env.local_rank, IntOr(s.local_rank, 0));
    TESSERA_ASSIGN_OR_RETURN(env.local_world_size, IntOr(s.local_size, 1));
    break;
  }
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return InvalidArgumentError("launcher environment (" + env.source + ") gives rank " +
                                std::to_string(env.rank) + " of " + std::to_string(env.world_size));
  }
  if (EnvString("TESSERA_RDZV")) env.source = env.source == "torchrun" ? "tessera" : env.source;
  if (auto rdzv = EnvString("TESSERA_RDZV")) {
    TESSERA_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(*rdzv));
    env.rdzv = hp;
  } else if (auto addr = EnvString("MASTER_ADDR")) {
    TESSERA_ASSIGN_OR_RETURN(int port, IntOr("MASTER_PORT", 29500));
    env.rdzv = HostPort{*addr, port};
  }
  TESSERA_ASSIGN_OR_RETURN(env.store_hosted_externally, EnvBoolOr("TESSERA_RDZV_EXTERNAL", false));
  if (auto job = EnvString("TESSERA_JOB_ID")) {
    env.job_id = *job;
  } else if (auto job = EnvString("OMPI_MCA_ess_base_jobid")) {
    env.job_id = "ompi" + *job;
  } else if (auto job = EnvString("SLURM_JOB_ID")) {
    env.job_id = "slurm" + *job + "_" + EnvStringOr("SLURM_STEP_ID", "0");
  } else if (auto job = EnvString("PMI_ID")) {
    env.job_id = "pmi" + *job;
  } else {
    env.job_id = "job";
  }
  TESSERA_ASSIGN_OR_RETURN(env.epoch, IntOr("TESSERA_EPOCH", 0));
  TESSERA_ASSIGN_OR_RETURN(env.supervisor_pid, IntOr("TESSERA_SUPERVISOR_PID", 0));
  if (env.epoch < 0 || env.supervisor_pid < 0) {
    return InvalidArgumentError("TESSERA_EPOCH and TESSERA_SUPERVISOR_PID must be >= 0");
  }
  return env;
}

std::string EpochJobId(const std::string& job_id, int epoch) {
  return epoch == 0 ? job_id : job_id + "_e" + std::to_string(epoch);
}

namespace {

// Under an MPI launcher (or with transport mpi) in an MPI build, MPI carries the
// bytes between hosts (options.h, TransportKind); TESSERA_MPI=0 keeps it off.
Status StartMpiIfWanted(const RankEnv& env, const CommOptions& options) {
  // mpirun sets OMPI_COMM_WORLD_*, MPICH's launchers PMI_*, srun --mpi=pmix PMIX_RANK.
  const bool mpi_launcher =
      env.source == "openmpi" || env.source == "pmi" || EnvString("PMIX_RANK").has_value();
  const bool wanted = options.transport == TransportKind::kMpi ||
                      (options.transport == TransportKind::kAuto && mpi_launcher &&
                       env.world_size > 1 && MpiBuilt() && EnvStringOr("TESSERA_MPI", "1") != "0");
  if (!wanted) return Status::Ok();
  TESSERA_RETURN_IF_ERROR(InitMpi());
  if (MpiWorldSize() != env.world_size || MpiWorldRank() != env.rank) {
    if (options.transport != TransportKind::kMpi) {
      // Not the launcher's world after all: leave MPI alone, TCP serves.
      TLOG_WARN("comm",
                "MPI's world (rank %d of %d) is not the launcher's (rank %d of %d): "
                "using TCP between hosts",
                MpiWorldRank(), MpiWorldSize(), env.rank, env.world_size);
      return Status::Ok();
    }
    return InvalidArgumentError(
        "transport mpi needs every rank started by one MPI launcher (mpirun -np " +
        std::to_string(env.world_size) + " …, or srun --mpi=pmix); this rank is MPI rank " +
        std::to_string(MpiWorldRank()) + " of " + std::to_string(MpiWorldSize()) + " but rank " +
        std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " to its launcher (" +
        env.source + ")");
  }
  return Status::Ok();
}

// Under MPI with no rendezvous address: rank 0 hosts the store on every interface
// with a fresh token (or the cluster's) and tells the others where through MPI
// itself, so `mpirun -H a,b tessera …` needs no MASTER_ADDR. Each rank tries rank
// 0's addresses in turn (loopback last); the token keeps out any other store.
Status BootstrapStoreOverMpi(const RankEnv& env, CommOptions* options, World* world) {
  std::string record;
  if (env.rank == 0) {
    if (options->cluster_token.empty()) {
      TESSERA_ASSIGN_OR_RETURN(options->cluster_token, GenerateClusterToken());
    }
    TESSERA_ASSIGN_OR_RETURN(world->store_server,
                             TcpStoreServer::Start("0.0.0.0", 0, options->cluster_token));
    record = std::to_string(world->store_server->port()) + " " + options->cluster_token;
    for (const std::string& address : LocalIpv4Addresses()) record += " " + address;
  }
  TESSERA_ASSIGN_OR_RETURN(record, MpiBroadcastString(record, 0));
  std::vector<std::string> fields;
  for (size_t at = 0; at < record.size();) {
    size_t end = record.find(' ', at);
    if (end == std::string::npos) end = record.size();
    fields.push_back(record.substr(at, end - at));
    at = end + 1;
  }
  if (fields.size() < 3) return InternalError("malformed rendezvous record from MPI rank 0");
  TESSERA_ASSIGN_OR_RETURN(int port, ParseInt("the store port", fields[0]));
  options->cluster_token = fields[1];
  Status last = UnavailableError("no address");
  for (size_t i = 2; i < fields.size(); ++i) {
    const HostPort address{fields[i], port};
    auto store =
        TcpStore::Connect(address, options->cluster_token,
                          Deadline::AfterMs(std::min<int64_t>(options->timeout_ms, 5'000)));
    if (store.ok()) {
      world->store = std::move(*store);
      return Status::Ok();
    }
    last = store.status();
  }
  return last.WithContext("reaching rank 0's rendezvous store (addresses from MPI: " +
                          record.substr(record.find(' ', record.find(' ') + 1) + 1) + ")");
}

}  // namespace

Result<World> InitWorld(const RankEnv& env, CommOptions options) {
  World world;
  if (env.world_size > 1) SetLogRankLabel("r" + std::to_string(env.rank));
  options.job_id = EpochJobId(env.job_id, env.epoch);
  if (options.local_ranks_hint == 0 && env.local_world_size > 1) {
    options.local_ranks_hint = env.local_world_size;
  }
  TESSERA_RETURN_IF_ERROR(StartMpiIfWanted(env, options));
  const Deadline deadline = Deadline::AfterMs(options.timeout_ms);
  const bool mpi_world = MpiActive() && MpiWorldSize() == env.world_size &&
                         MpiWorldRank() == env.rank && !EnvString("TESSERA_STORE_DIR");
  if (env.world_size == 1 && !env.rdzv) {
    world.store = std::make_shared<HashStore>();
  } else if (!env.rdzv && mpi_world) {
    TESSERA_RETURN_IF_ERROR(BootstrapStoreOverMpi(env, &options, &world));
  } else if (env.rdzv) {
    if (env.rank == 0 && !env.store_hosted_externally) {
      const std::string bind_host = StoreBindHost(env.rdzv->host);
      TESSERA_RETURN_IF_ERROR(CheckListeningNeedsToken(
          "the rendezvous store", bind_host, options.cluster_token, options.insecure_no_token));
      TESSERA_ASSIGN_OR_RETURN(world.store_server, TcpStoreServer::Start(bind_host, env.rdzv->port,
                                                                         options.cluster_token));
    }
    TESSERA_ASSIGN_OR_RETURN(auto store,
                             TcpStore::Connect(*env.rdzv, options.cluster_token, deadline));
    world.store = std::move(store);
  } else {
    std::string dir = EnvStringOr("TESSERA_STORE_DIR", "/tmp/tessera-store-" + env.job_id);
    TESSERA_ASSIGN_OR_RETURN(auto store, FileStore::Open(dir));
    store->RemoveWhenAllLeft(env.world_size);
    world.store = std::move(store);
  }
  TESSERA_ASSIGN_OR_RETURN(
      world.comm, Communicator::Create(world.store, env.rank, env.world_size, std::move(options)));
  return world;
}

}  // namespace tessera::comm
