// Helpers of the tests that run `tessera serve` as real processes on loopback
// (serve_process_test.cc, dp_process_test.cc): a server process with its log, a
// completion as a client sees it (streamed or not), greedy requests, distinct
// prompts, and Prometheus samples. Header-only; tests/serve only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::serve::process_test {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

inline std::string ModelPath() {
  return std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port nothing listens on right now (the server may still lose it to a race:
// Start retries).
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The pids whose parent is `parent` (from /proc/*/stat).
inline std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = ReadFile(entry.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

inline bool ProcessExists(pid_t pid) {
  // A zombie still has /proc/PID; it is gone for our purposes once it is not
  // running ("Z" state) — but our own children are reaped by Stop.
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// VmRSS of a process in KiB (0 if gone).
inline int64_t RssKib(pid_t pid) {
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

inline std::vector<std::string> ShmNamesWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// One `tessera serve` process (and, with --tp, the rank processes it starts, all
// in its own process group). The destructor kills whatever is still running and
// removes the directory of its logs (a failed start's assertion carries the log).
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() {
    Kill();
    RemoveLogs();
  }

  // Starts `tessera serve MODEL --port P extra…` (MODEL: stories260K unless given) and waits until
  // it has bound P and /health answers. Retries with another port when the bind loses a race.
  ::testing::AssertionResult Start(const std::vector<std::string>& extra,
                                   const std::string& model = ModelPath()) {
    RemoveLogs();
    char dir_template[] = "/tmp/tessera-serve-test.XXXXXX";
    if (!::mkdtemp(dir_template)) return ::testing::AssertionFailure() << "mkdtemp";
    dir_ = dir_template;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      if (port_ == 0) continue;
      log_path_ = dir_ + "/serve-" + std::to_string(attempt) + ".log";
      std::vector<std::string> args = {
          TESSERA_CLI_PATH, "serve", model, "--host", "127.0.0.1", "--port", std::to_string(port_)};
      args.insert(args.end(), extra.begin(), extra.end());
      Spawn(args);
      const std::string ready = "on http://127.0.0.1:" + std::to_string(port_) + " ";
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      bool bound = false;
      while (Clock::now() < deadline) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          break;  // it exited: bind failure or a bad flag; the log says which
        }
        if (ReadFile(log_path_).find(ready) != std::string::npos) {
          bound = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!bound) {
        const std::string log = ReadFile(log_path_);
        Kill();
        if (log.find("cannot bind") != std::string::npos) continue;  // lost the port: retry
        return ::testing::AssertionFailure() << "tessera serve did not start:\n" << log;
      }
      httplib::Client client = Client();
      while (Clock::now() < deadline) {
        httplib::Result res = client.Get("/health");
        if (res && res->status == 200) return ::testing::AssertionSuccess();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      Kill();
      return ::testing::AssertionFailure() << "no /health from tessera serve:\n" << Log();
    }
    return ::testing::AssertionFailure() << "could not start tessera serve on a free port";
  }

  // SIGTERM, then waits up to timeout for the exit; the exit code, or nullopt
  // (and the group killed) when it did not leave in time.
  std::optional<int> Stop(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return std::nullopt;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);  // its own group: the rank processes too
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  httplib::Client Client() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(5, 0);
    client.set_read_timeout(60, 0);
    client.set_write_timeout(10, 0);
    return client;
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string Log() const { return ReadFile(log_path_); }

 private:
  void RemoveLogs() {
    if (dir_.empty()) return;
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
    dir_.clear();
  }

  void Spawn(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test killed by its timeout takes it along
      if (::getppid() != parent) ::_exit(126);
      // The test process may block signals on some thread; the server must see them.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      const int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid_ > 0) ::setpgid(pid_, pid_);  // either side may win the race
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
  std::string log_path_;
};

// A completion's result as a client sees it.
struct Completion {
  int status = 0;
  std::string text;
  std::vector<double> token_logprobs;
  std::vector<std::string> tokens;
  std::string finish_reason;
  bool done = false;  // streaming: the body ended with data: [DONE]
  std::string body;
};

inline std::vector<std::string> SseData(const std::string& text) {
  std::vector<std::string> data;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    const std::string event = text.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) data.push_back(event.substr(6));
    pos = end + 2;
  }
  return data;
}

inline void AppendLogprobs(const json& lp, Completion* out) {
  if (!lp.is_object()) return;
  for (const json& v : lp["token_logprobs"]) out->token_logprobs.push_back(v.get<double>());
  for (const json& t : lp["tokens"]) out->tokens.push_back(t.get<std::string>());
}

inline Completion Complete(const ServerProcess& server, json request, const std::string& key = "") {
  httplib::Client client = server.Client();
  if (!key.empty()) client.set_bearer_token_auth(key.c_str());
  const bool stream = request.value("stream", false);
  httplib::Result res = client.Post("/v1/completions", request.dump(), "application/json");
  Completion out;
  if (!res) {
    out.body = "no response: " + httplib::to_string(res.error());
    return out;
  }
  out.status = res->status;
  out.body = res->body;
  if (res->status != 200) return out;
  if (!stream) {
    const json body = json::parse(res->body);
    const json& choice = body["choices"][0];
    out.text = choice["text"];
    out.finish_reason = choice["finish_reason"].is_string() ? choice["finish_reason"] : "";
    AppendLogprobs(choice.value("logprobs", json()), &out);
    return out;
  }
  for (const std::string& data : SseData(res->body)) {
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    const json chunk = json::parse(data);
    if (chunk["choices"].empty()) continue;  // the usage chunk
    const json& choice = chunk["choices"][0];
    out.text += choice["text"].get<std::string>();
    if (choice["finish_reason"].is_string()) out.finish_reason = choice["finish_reason"];
    AppendLogprobs(choice.value("logprobs", json()), &out);
  }
  return out;
}

inline json Greedy(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// Distinct short prompts, so each client's output is its own.
inline std::vector<std::string> Prompts(int n) {
  const char* subjects[] = {"Once upon a time", "The little dog",  "Lily saw a",
                            "Tom and his mom",  "One day, a bird", "The sun was",
                            "A big red ball",   "The cat"};
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::string(subjects[i % 8]) + (i / 8 == 0   ? ""
                                                  : i / 8 == 1 ? " went to the park"
                                                  : i / 8 == 2 ? " was very happy"
                                                               : " wanted to play"));
  }
  return out;
}

// A Prometheus sample's value (-1 when absent).
inline double MetricValue(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t pos = text.find(key);
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + key.size()));
}

inline std::string Metrics(const ServerProcess& server) {
  httplib::Client client = server.Client();
  httplib::Result res = client.Get("/metrics");
  return res && res->status == 200 ? "\n" + res->body : "";
}

}  // namespace tessera::serve::process_test
