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
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

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
  {
    TESSERA_ASSIGN_OR_RETURN(
        auto store, TcpStore::Connect(rdzv, spec.cluster_token, Deadline::AfterMs(300'000)));
    if (spec.node_rank == 0) {
      if (job_id.empty()) job_id = RandomJobId();
      TESSERA_RETURN_IF_ERROR(store->SetString("launch/job_id", job_id));
    } else {
      TESSERA_ASSIGN_OR_RETURN(std::string agreed,
                               store->GetString("launch/job_id", Deadline::AfterMs(300'000)));
      if (job_id.empty()) job_id = agreed;
    }
  }

  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);

  const int world = spec.nproc_per_node * spec.nnodes;
  std::vector<pid_t> pids;
  for (int local = 0; local < spec.nproc_per_node; ++local) {
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
    };
    if (!spec.cluster_token.empty()) env.push_back({"TESSERA_CLUSTER_TOKEN", spec.cluster_token});
    if (spec.insecure_no_token) env.push_back({"TESSERA_INSECURE_NO_TOKEN", "1"});
    for (const auto& kv : spec.extra_env) env.push_back(kv);
    // Build everything before fork: the child only calls async-signal-safe functions.
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
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
    for (const std::string& s : env_strings) full_env.push_back(s);
    std::vector<char*> envp;
    for (std::string& s : full_env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return InternalError(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::sigaction(SIGINT, &old_int, nullptr);
      ::sigaction(SIGTERM, &old_term, nullptr);
      ::execvpe(argv[0], argv.data(), envp.data());
      const char msg[] = "tessera launch: exec failed\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    pids.push_back(pid);
  }

  int exit_code = 0;
  int first_failed = -1;
  size_t running = pids.size();
  std::vector<bool> alive(pids.size(), true);
  int64_t kill_deadline_ns = 0;
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != pid || !alive[i]) continue;
        alive[i] = false;
        --running;
        int code = WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        if (code != 0 && first_failed < 0) {
          first_failed = static_cast<int>(i);
          exit_code = code;
          TLOG_ERROR("launch", "local rank %zu (pid %d) exited with %d; stopping the others", i,
                     pid, code);
        }
      }
      continue;
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
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  RemoveJobSharedMemory(job_id);
  return exit_code;
}

}  // namespace tessera::comm
