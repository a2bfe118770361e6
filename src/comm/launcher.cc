#include "comm/launcher.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "comm/exposure.h"
#include "comm/rank_env.h"
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

// The epoch the driver asks to restart (kRestartRequestSignal's value); -1: none.
volatile sig_atomic_t g_restart_request = -1;

void OnRestartRequest(int, siginfo_t* info, void*) { g_restart_request = info->si_value.sival_int; }

std::string RandomJobId() {
  uint64_t bits = 0;
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(&bits), 8);
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%012llx",
                static_cast<unsigned long long>(bits & 0xffffffffffffull));
  return buf;
}

std::string SanitizedJob(const std::string& job) {
  std::string out;
  for (char c : job) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') out += c;
    if (out.size() >= 40) break;
  }
  return out.empty() ? "job" : out;
}

// Starts one local rank of the job (fork + exec of spec.argv) with the
// torchrun-style environment of its epoch.
struct RankSpawner {
  const LaunchSpec& spec;
  HostPort rdzv;
  std::string job_id;
  bool supervised = false;

  Result<pid_t> Spawn(int local, int epoch, const struct sigaction& old_int,
                      const struct sigaction& old_term, const struct sigaction& old_restart) const {
    const int world = spec.nproc_per_node * spec.nnodes;
    const int rank = spec.node_rank * spec.nproc_per_node + local;
    std::vector<std::pair<std::string, std::string>> env = {
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc_per_node)},
        {"NODE_RANK", std::to_string(spec.node_rank)},
        {"GROUP_RANK", std::to_string(spec.node_rank)},
        {"MASTER_ADDR", rdzv.host},
        {"MASTER_PORT", std::to_string(rdzv.port)},
        {"TESSERA_RDZV", rdzv.ToString()},
        {"TESSERA_RDZV_EXTERNAL", "1"},
        {"TESSERA_JOB_ID", job_id},
        {"TESSERA_EPOCH", std::to_string(epoch)},
    };
    if (supervised) env.push_back({"TESSERA_SUPERVISOR_PID", std::to_string(::getpid())});
    if (!spec.cluster_token.empty()) env.push_back({"TESSERA_CLUSTER_TOKEN", spec.cluster_token});
    if (spec.insecure_no_token) env.push_back({"TESSERA_INSECURE_NO_TOKEN", "1"});
    for (const auto& kv : spec.extra_env) env.push_back(kv);
    // Build everything before fork: the child only calls async-signal-safe functions.
    std::vector<char*> argv;
    for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> full_env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      std::string key = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& [k, v] : env) overridden |= (k == key);
      if (!overridden) full_env.push_back(entry);
    }
    for (const auto& [k, v] : env) full_env.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& entry : full_env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return InternalError(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::sigaction(SIGINT, &old_int, nullptr);
      ::sigaction(SIGTERM, &old_term, nullptr);
      ::sigaction(kRestartRequestSignal, &old_restart, nullptr);
      ::execvpe(argv[0], argv.data(), envp.data());
      const char msg[] = "tessera launch: exec failed\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    return pid;
  }
};

// How often the launchers of a multi-node supervised job look at the board, and
// how long a follower with no ranks waits for an unreachable store.
constexpr int64_t kBoardPollNs = 100'000'000;
constexpr int64_t kBoardGiveUpNs = 60'000'000'000;

// The epochs of a supervised multi-node job, on the rendezvous store: the driver's
// node publishes the epoch it runs ("launch/epoch"); a follower node reports that
// its ranks failed in an epoch ("launch/failed/E") and follows the published
// epoch. Survives the store's connection breaking (a link down, the store's node
// unreachable): it reconnects on the next call, and a call that fails changes
// nothing.
class EpochBoard {
 public:
  EpochBoard(TcpStore& store, HostPort address, std::string token)
      : store_(&store), address_(std::move(address)), token_(std::move(token)) {}

  // The published epoch; -1 when the store cannot be reached.
  int Current() {
    auto value = Add("launch/epoch", 0);
    return value.ok() ? static_cast<int>(*value) : -1;
  }
  void Publish(int epoch) {
    if (epoch <= published_) return;
    const int current = Current();
    if (current < 0) return;
    if (current >= epoch || Add("launch/epoch", epoch - current).ok()) published_ = epoch;
  }
  void ReportFailure(int epoch) { (void)Add("launch/failed/" + std::to_string(epoch), 1); }
  // The driver's node ends the job: followers waiting for an epoch stop waiting.
  void MarkDone() { (void)Add("launch/done", 1); }
  bool Done() {
    auto value = Add("launch/done", 0);
    return value.ok() && *value > 0;
  }
  bool Failed(int epoch) {
    auto value = Add("launch/failed/" + std::to_string(epoch), 0);
    return value.ok() && *value > 0;
  }
  int64_t UnreachableForNs() const {
    return unreachable_since_ns_ == 0 ? 0 : NowNs() - unreachable_since_ns_;
  }

 private:
  Result<int64_t> Add(const std::string& key, int64_t delta) {
    if (store_ == nullptr) {
      auto fresh = TcpStore::Connect(address_, token_, Deadline::AfterMs(1000));
      if (!fresh.ok()) return Unreachable(fresh.status());
      owned_ = std::move(*fresh);
      store_ = owned_.get();
    }
    auto value = store_->Add(key, delta);
    if (!value.ok()) {
      store_ = nullptr;  // reconnect next time
      owned_.reset();
      return Unreachable(value.status());
    }
    unreachable_since_ns_ = 0;
    return value;
  }
  Status Unreachable(Status status) {
    if (unreachable_since_ns_ == 0) unreachable_since_ns_ = NowNs();
    return status;
  }

  TcpStore* store_;
  std::unique_ptr<TcpStore> owned_;
  HostPort address_;
  std::string token_;
  int published_ = 0;
  int64_t unreachable_since_ns_ = 0;
};

}  // namespace

int RemoveJobSharedMemory(const std::string& job_id) {
  const std::string prefix = "tessera-" + SanitizedJob(job_id) + "-";
  int removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* entry = ::readdir(dir)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
      if (::shm_unlink(("/" + std::string(entry->d_name)).c_str()) == 0) ++removed;
    }
  }
  ::closedir(dir);
  return removed;
}

Result<int> LaunchLocalRanks(const LaunchSpec& spec) {
  if (spec.argv.empty()) return InvalidArgumentError("launch: no command given");
  if (spec.nproc_per_node < 1 || spec.nnodes < 1 || spec.node_rank < 0 ||
      spec.node_rank >= spec.nnodes) {
    return InvalidArgumentError("launch: bad --nproc/--nnodes/--node-rank");
  }
  // The store: node 0 hosts it; every node's launcher also uses it to agree on the
  // job id.
  std::unique_ptr<TcpStoreServer> server;
  HostPort rdzv = spec.rdzv;
  if (rdzv.host.empty()) {
    if (spec.nnodes > 1) return InvalidArgumentError("launch: --nnodes > 1 needs --rdzv HOST:PORT");
    rdzv.host = "127.0.0.1";
  }
  // Refused here, before any rank starts, when the job would be reachable from
  // other hosts without a token (the ranks check again for themselves).
  const std::string store_host = StoreBindHost(rdzv.host);
  TESSERA_RETURN_IF_ERROR(CheckListeningNeedsToken(
      spec.node_rank == 0 ? "the rendezvous store (and the ranks)" : "the ranks", store_host,
      spec.cluster_token, spec.insecure_no_token));
  if (spec.node_rank == 0) {
    TESSERA_ASSIGN_OR_RETURN(server,
                             TcpStoreServer::Start(store_host, rdzv.port, spec.cluster_token));
    rdzv.port = server->port();
  }
  std::string job_id = spec.job_id;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                           TcpStore::Connect(rdzv, spec.cluster_token, Deadline::AfterMs(300'000)));
  if (spec.node_rank == 0) {
    if (job_id.empty()) job_id = RandomJobId();
    TESSERA_RETURN_IF_ERROR(store->SetString("launch/job_id", job_id));
  } else {
    TESSERA_ASSIGN_OR_RETURN(std::string agreed,
                             store->GetString("launch/job_id", Deadline::AfterMs(300'000)));
    if (job_id.empty()) job_id = agreed;
  }

  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{}, old_restart{};
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);
  const bool supervise = spec.max_restarts > 0;
  const bool driver_here =
      spec.driver_local_rank >= 0 && spec.driver_local_rank < spec.nproc_per_node;
  // Across nodes, the driver's node decides the epochs and the others follow.
  const bool follower = supervise && spec.nnodes > 1 && !driver_here;
  EpochBoard board(*store, rdzv, spec.cluster_token);
  struct sigaction restart_action {};
  restart_action.sa_sigaction = OnRestartRequest;
  restart_action.sa_flags = SA_SIGINFO;
  sigemptyset(&restart_action.sa_mask);
  ::sigaction(kRestartRequestSignal, &restart_action, &old_restart);
  g_restart_request = -1;

  RankSpawner spawner{.spec = spec, .rdzv = rdzv, .job_id = job_id, .supervised = supervise};
  std::vector<pid_t> pids(static_cast<size_t>(spec.nproc_per_node), -1);
  std::vector<bool> alive(pids.size(), false);
  size_t running = 0;
  // A follower that (re)joins starts its ranks at the job's current epoch.
  int epoch = follower ? std::max(board.Current(), 0) : 0;
  if (epoch > 0) TLOG_WARN("launch", "joining the running job at epoch %d", epoch);
  auto spawn = [&](int local) -> Status {
    TESSERA_ASSIGN_OR_RETURN(pids[static_cast<size_t>(local)],
                             spawner.Spawn(local, epoch, old_int, old_term, old_restart));
    alive[static_cast<size_t>(local)] = true;
    ++running;
    return Status::Ok();
  };
  for (int local = 0; local < spec.nproc_per_node; ++local) TESSERA_RETURN_IF_ERROR(spawn(local));

  // Supervision: kills every rank but the driver, waits for them, removes the
  // epoch's shared memory and starts them at the next epoch.
  // No driver on a follower node: every local rank is replaced.
  const size_t driver = driver_here ? static_cast<size_t>(spec.driver_local_rank) : pids.size();
  // Kills this node's ranks but the driver (a stopped, frozen one too) and waits
  // for them; removes the epoch's shared memory.
  auto stop_workers = [&] {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (i != driver && alive[i]) ::kill(pids[i], SIGKILL);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (i == driver || !alive[i]) continue;
      int status = 0;
      while (::waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
      }
      alive[i] = false;
      --running;
    }
    RemoveJobSharedMemory(EpochJobId(job_id, epoch));
  };
  auto start_workers = [&]() -> Status {
    for (int local = 0; local < spec.nproc_per_node; ++local) {
      if (static_cast<size_t>(local) != driver) TESSERA_RETURN_IF_ERROR(spawn(local));
    }
    return Status::Ok();
  };
  // The driver's node: a new epoch, published for the followers before its own
  // ranks start, announced to the driver.
  auto restart_workers = [&](const std::string& why) -> Status {
    TLOG_WARN("launch",
              "%s: restarting the ranks beside the driver at epoch %d (restart %d of at most %d)",
              why.c_str(), epoch + 1, epoch + 1, spec.max_restarts);
    stop_workers();
    ++epoch;
    if (spec.nnodes > 1) board.Publish(epoch);
    TESSERA_RETURN_IF_ERROR(start_workers());
    if (alive[driver]) {
      union sigval value {};
      value.sival_int = epoch;
      ::sigqueue(pids[driver], kEpochStartedSignal, value);
    }
    return Status::Ok();
  };
  const bool can_supervise = supervise && driver_here;
  // A follower whose ranks failed waits for the driver's node to move on.
  bool awaiting_epoch = false;
  int64_t next_board_ns = 0;

  int exit_code = 0;
  int first_failed = -1;
  int64_t kill_deadline_ns = 0;
  while (running > 0 || (awaiting_epoch && g_stop_signal == 0)) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != pid || !alive[i]) continue;
        alive[i] = false;
        --running;
        int code = WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        const bool stopping = first_failed >= 0 || g_stop_signal != 0;
        if (code != 0 && i != driver && can_supervise && !stopping && alive[driver] &&
            epoch < spec.max_restarts) {
          TESSERA_RETURN_IF_ERROR(restart_workers("local rank " + std::to_string(i) + " (pid " +
                                                  std::to_string(pid) + ") exited with " +
                                                  std::to_string(code)));
          break;
        }
        if (code != 0 && follower && !stopping) {
          TLOG_WARN("launch",
                    "local rank %zu (pid %d) exited with %d in epoch %d; stopping this node's "
                    "ranks until the driver's node starts the next epoch",
                    i, pid, code, epoch);
          stop_workers();
          board.ReportFailure(epoch);
          awaiting_epoch = true;
          break;
        }
        if (code != 0 && first_failed < 0) {
          first_failed = static_cast<int>(i);
          exit_code = code;
          TLOG_ERROR("launch", "local rank %zu (pid %d) exited with %d; stopping the others", i,
                     pid, code);
        }
      }
      continue;
    }
    if (spec.nnodes > 1 && supervise && NowNs() >= next_board_ns && g_stop_signal == 0 &&
        first_failed < 0) {
      next_board_ns = NowNs() + kBoardPollNs;
      if (follower) {
        const int current = board.Current();
        if (current > epoch) {
          TLOG_WARN("launch", "the driver's node started epoch %d: replacing this node's ranks",
                    current);
          stop_workers();
          epoch = current;
          awaiting_epoch = false;
          TESSERA_RETURN_IF_ERROR(start_workers());
          continue;
        }
        if (awaiting_epoch && board.Done()) {
          TLOG_INFO("launch", "the driver's node ended the job");
          awaiting_epoch = false;
        }
        if (awaiting_epoch && board.UnreachableForNs() > kBoardGiveUpNs) {
          TLOG_ERROR("launch", "the rendezvous store has been unreachable for %lld s; giving up",
                     static_cast<long long>(kBoardGiveUpNs / 1'000'000'000));
          first_failed = 0;
          exit_code = 1;
          awaiting_epoch = false;
        }
      } else if (can_supervise) {
        board.Publish(epoch);  // again, if an earlier publication failed
        if (board.Failed(epoch) && alive[driver] && epoch < spec.max_restarts) {
          TESSERA_RETURN_IF_ERROR(
              restart_workers("a rank on another node failed in epoch " + std::to_string(epoch)));
          continue;
        }
      }
    }
    const int requested = g_restart_request;
    if (requested >= 0) {
      g_restart_request = -1;
      const bool stopping = first_failed >= 0 || g_stop_signal != 0;
      if (requested == epoch && can_supervise && !stopping && alive[driver]) {
        if (epoch < spec.max_restarts) {
          TESSERA_RETURN_IF_ERROR(
              restart_workers("the driver lost epoch " + std::to_string(requested)));
        } else {
          TLOG_ERROR("launch", "the driver lost epoch %d and %d restarts are used up; stopping",
                     requested, spec.max_restarts);
          first_failed = 0;
          exit_code = 1;
        }
      }
    }
    if ((first_failed >= 0 || g_stop_signal != 0) && kill_deadline_ns == 0) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (alive[i]) ::kill(pids[i], SIGTERM);
      }
      kill_deadline_ns = NowNs() + static_cast<int64_t>(spec.grace_ms) * 1'000'000;
      if (g_stop_signal != 0 && exit_code == 0) exit_code = 128 + g_stop_signal;
    }
    if (kill_deadline_ns != 0 && NowNs() > kill_deadline_ns) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (alive[i]) ::kill(pids[i], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (can_supervise && spec.nnodes > 1) board.MarkDone();
  ::sigaction(kRestartRequestSignal, &old_restart, nullptr);
  for (int e = 0; e < epoch; ++e) RemoveJobSharedMemory(EpochJobId(job_id, e));
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  RemoveJobSharedMemory(job_id);
  return exit_code;
}

}  // namespace tessera::comm
