#include "apps/tessera/serve_front.h"

#ifdef TESSERA_HAVE_SERVE
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "apps/tessera/cli_util.h"
#include "base/clock.h"
#include "base/env.h"
#include "comm/rendezvous/tcp_store.h"

extern char** environ;

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// Restart backoff of a local replica that exited: doubles from 0.5 s up to 10 s,
// back to 0.5 s once it has stayed up a minute.
constexpr int64_t kFirstBackoffNs = 500'000'000;
constexpr int64_t kMaxBackoffNs = 10'000'000'000;
constexpr int64_t kStableNs = 60'000'000'000;

// n random bytes as hex (a cluster token for a job that set none).
std::string RandomHex(size_t n) {
  std::string out;
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  static const char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    const int byte = urandom.get() & 0xff;
    out += kDigits[byte >> 4];
    out += kDigits[byte & 15];
  }
  return out;
}

std::string Describe(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit code " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return "signal " + std::to_string(WTERMSIG(wait_status));
  return "status " + std::to_string(wait_status);
}

// http://HOST:PORT (or HOST:PORT) → host, port.
Result<std::pair<std::string, int>> ParseReplicaUrl(const std::string& url) {
  std::string rest = url;
  if (rest.starts_with("http://")) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError("--replica '" + url + "' is not http://HOST:PORT");
  }
  char* end = nullptr;
  const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 1 || port > 65535) {
    return InvalidArgumentError("--replica '" + url + "': bad port");
  }
  return std::make_pair(rest.substr(0, colon), static_cast<int>(port));
}

// The local replicas: child processes running this command line as replicas.
class LocalReplicas {
 public:
  // Extra environment of local replica i (--pd: its role).
  std::function<std::vector<std::string>(size_t)> extra_env;

  LocalReplicas(serve::DpFront& front, int first_index, int count)
      : front_(front), first_(first_index), slots_(static_cast<size_t>(count)) {
    char dir[] = "/tmp/tessera-dp.XXXXXX";
    if (::mkdtemp(dir) != nullptr) dir_ = dir;
    argv_ = OwnCommandLine();
  }
  ~LocalReplicas() {
    StopAll();
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  Status StartAll() {
    if (dir_.empty()) return InternalError("cannot create a directory for the replicas' ports");
    for (size_t i = 0; i < slots_.size(); ++i) TESSERA_RETURN_IF_ERROR(Spawn(i));
    supervisor_ = std::thread([this] { Supervise(); });
    return Status::Ok();
  }

  // Fails when a replica exits before it ever came up (bad flags, no memory).
  Status WaitAllUp(int64_t timeout_ms) {
    const int64_t deadline = NowNs() + timeout_ms * 1'000'000;
    while (NowNs() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!startup_error_.empty()) return UnavailableError(startup_error_);
      }
      bool all_up = true;
      for (size_t i = 0; i < slots_.size(); ++i) {
        all_up = all_up && front_.replica_up(first_ + static_cast<int>(i));
      }
      if (all_up) return Status::Ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return DeadlineExceededError("the replicas did not come up within " +
                                 std::to_string(timeout_ms / 1000) + " s");
  }

  // SIGTERM to every replica (they cancel their requests), then waits for them
  // (SIGKILL after grace_ms).
  void Terminate() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Slot& s : slots_) {
      if (s.pid > 0) ::kill(s.pid, SIGTERM);
    }
  }

  void StopAll(int64_t grace_ms = 10'000) {
    Terminate();
    if (supervisor_.joinable()) supervisor_.join();
    const int64_t deadline = NowNs() + grace_ms * 1'000'000;
    for (Slot& s : slots_) {
      while (s.pid > 0) {
        if (::waitpid(s.pid, nullptr, WNOHANG) == s.pid) {
          s.pid = -1;
        } else if (NowNs() >= deadline) {
          ::kill(s.pid, SIGKILL);
          ::waitpid(s.pid, nullptr, 0);
          s.pid = -1;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    }
  }

 private:
  struct Slot {
    pid_t pid = -1;
    bool ever_up = false;
    bool port_known = false;
    int64_t started_ns = 0;
    int64_t restart_at_ns = 0;  // when pid < 0: start again at this time
    int64_t backoff_ns = kFirstBackoffNs;
  };

  std::string PortFile(size_t i) const { return dir_ + "/replica-" + std::to_string(i) + ".port"; }

  // fork + exec of this command line with the replica's environment (prepared
  // before the fork: the child of a threaded process may only exec).
  Status Spawn(size_t i) {
    Slot& s = slots_[i];
    std::error_code ignored;
    fs::remove(PortFile(i), ignored);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!std::string_view(*e).starts_with(std::string(kReplicaPortFileEnv) + "=")) {
        env.emplace_back(*e);
      }
    }
    env.push_back(std::string(kReplicaPortFileEnv) + "=" + PortFile(i));
    if (extra_env) {
      for (std::string& e : extra_env(i)) env.push_back(std::move(e));
    }
    std::vector<char*> argv, envp;
    for (std::string& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return InternalError("fork failed for replica " + std::to_string(i));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the front died: its replicas stop
      if (::getppid() != parent) ::_exit(126);
      // The front blocks the stop signals in every thread (a watcher takes them):
      // the replica (its launcher, with --tp/--pp) starts with none blocked.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    s.pid = pid;
    s.port_known = false;
    s.started_ns = NowNs();
    return Status::Ok();
  }

  void Supervise() {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      for (size_t i = 0; i < slots_.size(); ++i) Check(i);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void Check(size_t i) {
    Slot& s = slots_[i];
    const int index = first_ + static_cast<int>(i);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (s.pid > 0) {
      int status = 0;
      if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
        s.pid = -1;
        const std::string why = "its process exited (" + Describe(status) + ")";
        if (!s.ever_up) {
          startup_error_ = "replica " + std::to_string(index) + " " + why + " before it was up";
        }
        front_.MarkDown(index, why);
        front_.SetReplicaAddress(index, "127.0.0.1", 0);  // not polled until it is back
        if (NowNs() - s.started_ns > kStableNs) s.backoff_ns = kFirstBackoffNs;
        s.restart_at_ns = NowNs() + s.backoff_ns;
        std::fprintf(stderr, "tessera serve: replica %d %s; restarting it in %.1f s\n", index,
                     why.c_str(), static_cast<double>(s.backoff_ns) * 1e-9);
        s.backoff_ns = std::min(2 * s.backoff_ns, kMaxBackoffNs);
        return;
      }
      if (!s.port_known) {
        std::ifstream in(PortFile(i));
        int port = 0;
        if (in >> port && port > 0) {
          s.port_known = true;
          front_.SetReplicaAddress(index, "127.0.0.1", port);
        }
      } else if (!s.ever_up && front_.replica_up(index)) {
        s.ever_up = true;  // from now on an exit is a failure to recover from
      }
      return;
    }
    if (s.ever_up && NowNs() >= s.restart_at_ns) {
      if (Status started = Spawn(i); started.ok()) {
        front_.CountRestart(index);
      } else {
        s.restart_at_ns = NowNs() + s.backoff_ns;
      }
    }
  }

  serve::DpFront& front_;
  const int first_;
  std::string dir_;
  std::vector<std::string> argv_;
  std::mutex mu_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  std::string startup_error_;
  std::thread supervisor_;
};

}  // namespace

Result<std::pair<int, int>> ParsePdCounts(const std::string& text) {
  int prefill = 0, decode = 0;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%d:%d%c", &prefill, &decode, &extra) != 2 || prefill < 0 ||
      decode < 0) {
    return InvalidArgumentError("--pd '" + text +
                                "' is not P:D (local prefill and decode instances, >= 0)");
  }
  return std::make_pair(prefill, decode);
}

Status WriteReplicaPortFile(int port) {
  const char* path = std::getenv(kReplicaPortFileEnv);
  if (path == nullptr || *path == '\0') return Status::Ok();
  const std::string tmp = std::string(path) + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out) return InternalError("cannot write " + tmp);
  }
  std::error_code error;
  fs::rename(tmp, path, error);
  if (error) return InternalError("cannot rename " + tmp + ": " + error.message());
  return Status::Ok();
}

namespace {

// --pd: the links' rendezvous store, authenticated with the cluster token (one
// made up for the job when none is set and every instance is local), and what the
// local instances find in their environment. The layout is published in the
// store for instances started elsewhere (--pd-join).
struct PdRendezvous {
  std::unique_ptr<comm::TcpStoreServer> server;
  std::unique_ptr<comm::TcpStore> publisher;  // this front's own client
  std::vector<std::string> env;
};

Result<PdRendezvous> StartPdRendezvous(const FrontArgs& args) {
  PdRendezvous pd;
  std::string token = EnvStringOr("TESSERA_CLUSTER_TOKEN", "");
  const bool remote = !args.pd_prefill_urls.empty() || !args.pd_decode_urls.empty();
  if (token.empty()) {
    if (remote) {
      return InvalidArgumentError(
          "--pd with instances on other hosts needs TESSERA_CLUSTER_TOKEN, the same on "
          "every host (it authenticates the store and the KV links)");
    }
    token = RandomHex(16);
    pd.env.push_back("TESSERA_CLUSTER_TOKEN=" + token);
  }
  comm::HostPort bind{"127.0.0.1", 0};
  if (!args.pd_store.empty()) {
    TESSERA_ASSIGN_OR_RETURN(bind, comm::ParseHostPort(args.pd_store));
  }
  TESSERA_ASSIGN_OR_RETURN(pd.server, comm::TcpStoreServer::Start(bind.host, bind.port, token));
  // Local instances reach it on loopback unless it listens on one address only.
  const std::string local_host =
      bind.host == "0.0.0.0" || bind.host.empty() ? "127.0.0.1" : bind.host;
  const comm::HostPort local{local_host, pd.server->port()};
  const std::string job = "pd" + std::to_string(::getpid()) + "-" + RandomHex(4);
  pd.env.push_back(std::string(kPdStoreEnv) + "=" + local_host + ":" +
                   std::to_string(pd.server->port()));
  pd.env.push_back(std::string(kPdJobEnv) + "=" + job);
  TESSERA_ASSIGN_OR_RETURN(pd.publisher,
                           comm::TcpStore::Connect(local, token, Deadline::AfterMs(10'000)));
  const std::string layout =
      std::to_string(args.num_prefill()) + ":" + std::to_string(args.num_decode()) + ":" + job;
  TESSERA_RETURN_IF_ERROR(pd.publisher->Set(
      kPdLayoutKey,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(layout.data()), layout.size())));
  return pd;
}

// Sets replica `first + i`'s address for each url.
Status SetRemoteAddresses(serve::DpFront& front, int first, const std::vector<std::string>& urls) {
  for (size_t r = 0; r < urls.size(); ++r) {
    TESSERA_ASSIGN_OR_RETURN(auto host_port, ParseReplicaUrl(urls[r]));
    front.SetReplicaAddress(first + static_cast<int>(r), host_port.first, host_port.second);
  }
  return Status::Ok();
}

}  // namespace

Status RunServeFront(const FrontArgs& args, const model::Tokenizer& tokenizer,
                     const serve::ChatTemplate* chat, const sigset_t& stop_signals) {
  const bool pd = args.pd();
  const int num_prefill = args.num_prefill();
  const int total =
      pd ? num_prefill + args.num_decode() : args.dp + static_cast<int>(args.replicas.size());
  serve::DpFront front(total, &tokenizer, chat, args.options);
  PdRendezvous pd_rendezvous;
  if (pd) {
    TESSERA_ASSIGN_OR_RETURN(pd_rendezvous, StartPdRendezvous(args));
    TESSERA_RETURN_IF_ERROR(SetRemoteAddresses(front, args.pd_prefill, args.pd_prefill_urls));
    TESSERA_RETURN_IF_ERROR(
        SetRemoteAddresses(front, num_prefill + args.pd_decode, args.pd_decode_urls));
  } else {
    TESSERA_RETURN_IF_ERROR(SetRemoteAddresses(front, args.dp, args.replicas));
  }
  // The front's port first: nothing else (a replica) can take it meanwhile.
  TESSERA_ASSIGN_OR_RETURN(const int port, front.Bind());
  // The local replicas: under --pd two groups, the prefill and the decode instances.
  std::vector<std::unique_ptr<LocalReplicas>> local;
  if (!pd) {
    local.push_back(std::make_unique<LocalReplicas>(front, 0, args.dp));
  } else {
    for (const bool prefill : {true, false}) {
      const int count = prefill ? args.pd_prefill : args.pd_decode;
      if (count == 0) continue;
      auto& group = local.emplace_back(
          std::make_unique<LocalReplicas>(front, prefill ? 0 : num_prefill, count));
      group->extra_env = [&args, &pd_rendezvous, prefill](size_t i) {
        std::vector<std::string> env = pd_rendezvous.env;
        env.push_back(std::string(kPdRoleEnv) + "=" + (prefill ? "prefill:" : "decode:") +
                      std::to_string(i) + ":" + std::to_string(args.num_prefill()) + ":" +
                      std::to_string(args.num_decode()));
        return env;
      };
    }
  }
  for (auto& group : local) TESSERA_RETURN_IF_ERROR(group->StartAll());
  for (auto& group : local) {
    if (Status up = group->WaitAllUp(600'000); !up.ok()) {
      front.Stop();
      return up;
    }
  }
  // Remote replicas: a little time to answer; those that do not join later.
  const int64_t deadline = NowNs() + 10'000'000'000;
  while (front.num_up() < total && NowNs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (front.num_up() < total) {
    std::fprintf(stderr, "tessera serve: %d of %d replicas up; the others join when they answer\n",
                 front.num_up(), total);
  }

  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    const timespec poll = {0, 200'000'000};
    while (!done.load()) {
      siginfo_t info{};
      const int sig = sigtimedwait(&stop_signals, &info, &poll);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "tessera serve: signal %d: stopping the replicas, then the front\n",
                     sig);
        for (auto& group : local) group->Terminate();  // streams end "cancelled", relayed
        const int64_t stop_deadline = NowNs() + 3'000'000'000;
        while (front.open_streams() > 0 && NowNs() < stop_deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        front.Stop();
        return;
      }
    }
  });
  if (pd) {
    std::fprintf(stderr,
                 "tessera serve: prefill/decode front on http://%s:%d (%d prefill, %d decode "
                 "instances; KV over tessera::comm; router %s over the decode ones)\n",
                 args.options.server.host.c_str(), port, num_prefill, args.num_decode(),
                 std::string(serve::RouterPolicyName(args.options.policy)).c_str());
  } else {
    std::fprintf(stderr,
                 "tessera serve: data-parallel front on http://%s:%d (%d replicas: %d local, %zu "
                 "remote; router %s)\n",
                 args.options.server.host.c_str(), port, total, args.dp, args.replicas.size(),
                 std::string(serve::RouterPolicyName(args.options.policy)).c_str());
  }
  Status serve_status = front.Serve();
  done.store(true);
  signal_thread.join();
  for (auto& group : local) group->StopAll();
  return serve_status;
}

}  // namespace tessera::cli
#endif  // TESSERA_HAVE_SERVE
