// `tessera serve` as a real process on loopback (fork/exec of the CLI on a port
// picked here), on ../shared/models/stories260K.gguf: completions streamed and
// not, concurrent clients and a tiny KV budget (preemption) giving each request
// its single-request greedy output, a disconnect freeing its KV blocks, auth, bad
// input, SIGTERM leaving no process or shared memory behind, --tp 2 equal to one
// rank bit for bit, and 256 concurrent streams with bounded memory.
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

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string ModelPath() { return std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port nothing listens on right now (the server may still lose it to a race:
// Start retries).
int FreePort() {
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
std::vector<pid_t> ChildrenOf(pid_t parent) {
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

bool ProcessExists(pid_t pid) {
  // A zombie still has /proc/PID; it is gone for our purposes once it is not
  // running ("Z" state) — but our own children are reaped by Stop.
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// VmRSS of a process in KiB (0 if gone).
int64_t RssKib(pid_t pid) {
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

std::vector<std::string> ShmNamesWithPrefix(const std::string& prefix) {
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

  // Starts `tessera serve MODEL --port P extra…` and waits until it has bound P
  // and /health answers. Retries with another port when the bind loses a race.
  ::testing::AssertionResult Start(const std::vector<std::string>& extra) {
    RemoveLogs();
    char dir_template[] = "/tmp/tessera-serve-test.XXXXXX";
    if (!::mkdtemp(dir_template)) return ::testing::AssertionFailure() << "mkdtemp";
    dir_ = dir_template;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      if (port_ == 0) continue;
      log_path_ = dir_ + "/serve-" + std::to_string(attempt) + ".log";
      std::vector<std::string> args = {TESSERA_CLI_PATH, "serve",  ModelPath(),          "--host",
                                       "127.0.0.1",      "--port", std::to_string(port_)};
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

std::vector<std::string> SseData(const std::string& text) {
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

void AppendLogprobs(const json& lp, Completion* out) {
  if (!lp.is_object()) return;
  for (const json& v : lp["token_logprobs"]) out->token_logprobs.push_back(v.get<double>());
  for (const json& t : lp["tokens"]) out->tokens.push_back(t.get<std::string>());
}

Completion Complete(const ServerProcess& server, json request, const std::string& key = "") {
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

json Greedy(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// Distinct short prompts, so each client's output is its own.
std::vector<std::string> Prompts(int n) {
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
double MetricValue(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t pos = text.find(key);
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + key.size()));
}

std::string Metrics(const ServerProcess& server) {
  httplib::Client client = server.Client();
  httplib::Result res = client.Get("/metrics");
  return res && res->status == 200 ? "\n" + res->body : "";
}

// tessera_kv_cache_blocks_used once it reads 0, or its last value after 5 s (the
// gauge is refreshed per scheduler step, so it lags the last response).
double WaitForKvBlocksFree(const ServerProcess& server) {
  double blocks = -1;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    blocks = MetricValue(Metrics(server), "tessera_kv_cache_blocks_used");
    if (blocks == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return blocks;
}

void ExpectOpenAiError(const Completion& c, int status, const std::string& what) {
  EXPECT_EQ(c.status, status) << what << ": " << c.body;
  const json body = json::parse(c.body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << what << ": " << c.body;
  const json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string()) << what;
  EXPECT_TRUE(error.contains("type") && error.contains("param") && error.contains("code")) << what;
}

class ServeProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }
  void SetUp() override {
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "no " << ModelPath();
  }
};

TEST_F(ServeProcessTest, StreamingAndNotAgree) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1"}));
  json request = Greedy("Once upon a time", 16);
  request["logprobs"] = 1;
  const Completion whole = Complete(server, request);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_FALSE(whole.text.empty());
  EXPECT_FALSE(whole.finish_reason.empty());
  request["stream"] = true;
  const Completion streamed = Complete(server, request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_TRUE(streamed.done) << streamed.body;
  EXPECT_EQ(streamed.text, whole.text);
  EXPECT_EQ(streamed.tokens, whole.tokens);
  EXPECT_EQ(streamed.token_logprobs, whole.token_logprobs);
  EXPECT_EQ(streamed.finish_reason, whole.finish_reason);
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

// Every client of a concurrent burst gets exactly what it gets alone; run on the
// normal server and on one whose KV cache holds two sequences (preempting).
void ExpectConcurrentEqualsAlone(ServerProcess& server, int num_clients, bool expect_preemption) {
  const std::vector<std::string> prompts = Prompts(num_clients);
  std::vector<Completion> alone;
  for (const std::string& p : prompts) {
    json request = Greedy(p, 16);
    request["logprobs"] = 1;
    request["ignore_eos"] = true;
    alone.push_back(Complete(server, request));
    ASSERT_EQ(alone.back().status, 200) << alone.back().body;
  }
  std::vector<Completion> together(num_clients);
  std::vector<std::thread> clients;
  for (int i = 0; i < num_clients; ++i) {
    clients.emplace_back([&, i] {
      json request = Greedy(prompts[i], 16);
      request["logprobs"] = 1;
      request["ignore_eos"] = true;
      request["stream"] = i % 2 == 1;  // half of them stream
      together[i] = Complete(server, request);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < num_clients; ++i) {
    ASSERT_EQ(together[i].status, 200) << prompts[i] << ": " << together[i].body;
    EXPECT_EQ(together[i].text, alone[i].text) << prompts[i];
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << prompts[i];
    EXPECT_EQ(together[i].token_logprobs, alone[i].token_logprobs) << prompts[i];
    EXPECT_EQ(together[i].tokens.size(), 16u) << prompts[i];
  }
  const std::string m = Metrics(server);
  const double preemptions = MetricValue(m, "tessera_preemptions_total");
  if (expect_preemption) {
    EXPECT_GT(preemptions, 0) << m;
  }
  EXPECT_EQ(WaitForKvBlocksFree(server), 0) << m;
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

TEST_F(ServeProcessTest, ConcurrentClientsGetTheirSingleRequestOutput) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--http-threads", "64"}));
  ExpectConcurrentEqualsAlone(server, 32, /*expect_preemption=*/false);
}

TEST_F(ServeProcessTest, TinyKvBudgetPreemptsAndGivesTheSameOutputs) {
  // 64 tokens = 4 blocks of 16: two sequences of prompt + 16 tokens at a time,
  // so 32 concurrent requests must queue and preempt.
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--http-threads", "64", "--kv-tokens", "64"}));
  ExpectConcurrentEqualsAlone(server, 32, /*expect_preemption=*/true);
}

TEST_F(ServeProcessTest, DisconnectFreesKvBlocks) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1"}));
  const std::string m0 = Metrics(server);
  const std::string cancelled_series =
      "tessera_requests_total{endpoint=\"completions\",finish_reason=\"cancelled\"}";
  const double cancelled_before = std::max(0.0, MetricValue(m0, cancelled_series));

  httplib::Client client = server.Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{
      {"prompt", "Once"},
      {"max_tokens", 480},
      {"ignore_eos", true},
      {"temperature", 0},
      {"stream",
       true}}.dump();
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return false;  // hang up after the first chunk
  };
  EXPECT_FALSE(client.send(req));
  double blocks = -1;
  double cancelled = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    const std::string m = Metrics(server);
    blocks = MetricValue(m, "tessera_kv_cache_blocks_used");
    cancelled = MetricValue(m, cancelled_series);
    if (blocks == 0 && cancelled > cancelled_before) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(blocks, 0);
  EXPECT_GT(cancelled, cancelled_before) << "the request was not cancelled by the disconnect";
  // And the server still serves.
  EXPECT_EQ(Complete(server, Greedy("Once", 4)).status, 200);
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

TEST_F(ServeProcessTest, ApiKey) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--api-key", "sekrit"}));
  const json request = Greedy("Once", 4);
  const Completion anonymous = Complete(server, request);
  ExpectOpenAiError(anonymous, 401, "no key");
  const Completion wrong = Complete(server, request, "guess");
  ExpectOpenAiError(wrong, 401, "wrong key");
  const Completion ok = Complete(server, request, "sekrit");
  EXPECT_EQ(ok.status, 200) << ok.body;
  httplib::Client open = server.Client();
  httplib::Result health = open.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

TEST_F(ServeProcessTest, BadInputGetsOpenAiErrors) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--max-body-bytes", "4096", "--max-model-len", "128"}));
  httplib::Client client = server.Client();
  auto post = [&](const std::string& path, const std::string& body) {
    httplib::Result res = client.Post(path.c_str(), body, "application/json");
    Completion c;
    if (res) {
      c.status = res->status;
      c.body = res->body;
    }
    return c;
  };
  ExpectOpenAiError(post("/v1/completions", R"({"prompt":"x",)"), 400, "malformed JSON");
  ExpectOpenAiError(post("/v1/completions", R"({"prompt":"x","max_tokens":-1})"), 400,
                    "max_tokens -1");
  ExpectOpenAiError(post("/v1/completions", R"({"prompt":"x","temperature":"warm"})"), 400,
                    "temperature a string");
  ExpectOpenAiError(post("/v1/completions", R"({"prompt":"x","model":"gpt-4"})"), 404,
                    "unknown model");
  ExpectOpenAiError(post("/v1/completions", json{{"prompt", std::vector<int>(200, 100)}}.dump()),
                    400, "prompt over the context");
  ExpectOpenAiError(post("/v1/completions", R"({"prompt":")" + std::string(8192, 'a') + "\"}"), 413,
                    "body over --max-body-bytes");
  ExpectOpenAiError(post("/v1/chat/completions", R"({"messages":[]})"), 400, "chat");
  ExpectOpenAiError(post("/v1/nothing", "{}"), 404, "unknown route");
  EXPECT_EQ(Complete(server, Greedy("Once", 4)).status, 200);
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

// SIGTERM with a stream in flight: the server and its ranks exit 0 within a few
// seconds, and the job's shared-memory segments are gone.
void ExpectSigtermLeavesNothing(const std::vector<std::string>& extra, int num_ranks) {
  ServerProcess server;
  ASSERT_TRUE(server.Start(extra));
  ASSERT_EQ(Complete(server, Greedy("Once", 4)).status, 200);
  std::vector<pid_t> ranks = ChildrenOf(server.pid());
  std::string job_prefix;
  if (num_ranks > 1) {
    ASSERT_EQ(ranks.size(), static_cast<size_t>(num_ranks));
    std::string environ_text = ReadFile("/proc/" + std::to_string(ranks[0]) + "/environ");
    for (char& c : environ_text) c = c == '\0' ? '\n' : c;
    std::istringstream env(environ_text);
    std::string line;
    std::string job;
    while (std::getline(env, line)) {
      if (line.rfind("TESSERA_JOB_ID=", 0) == 0) job = line.substr(15);
    }
    ASSERT_FALSE(job.empty());
    job_prefix = "tessera-" + job + "-";
  }
  // A long stream in flight when the signal comes.
  std::atomic<bool> streaming{false};
  std::string stream_body;
  std::thread client([&] {
    httplib::Client c = server.Client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body = json{{"prompt", "Once"}, {"max_tokens", 480}, {"ignore_eos", true}, {"stream", true}}
                   .dump();
    req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      stream_body.append(data, size);
      streaming = true;
      return true;
    };
    c.send(req);
  });
  const auto wait_deadline = Clock::now() + std::chrono::seconds(10);
  while (!streaming && Clock::now() < wait_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto start = Clock::now();
  const std::optional<int> code = server.Stop(std::chrono::seconds(5));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  client.join();
  ASSERT_TRUE(code.has_value()) << "still running 5 s after SIGTERM:\n" << server.Log();
  EXPECT_EQ(*code, 0) << server.Log();
  EXPECT_LT(seconds, 5.0);
  // The launcher logs any rank that exits non-zero.
  EXPECT_EQ(server.Log().find("exited with"), std::string::npos) << server.Log();
  for (pid_t rank : ranks) EXPECT_FALSE(ProcessExists(rank)) << "rank pid " << rank << " left";
  if (!job_prefix.empty()) {
    const std::vector<std::string> left = ShmNamesWithPrefix(job_prefix);
    EXPECT_TRUE(left.empty()) << left.size() << " shm segments left, e.g. " << left[0];
  }
  // The open stream was told, not cut: its last chunks are the "cancelled" finish
  // and [DONE].
  EXPECT_NE(stream_body.find("\"finish_reason\":\"cancelled\""), std::string::npos)
      << stream_body.substr(stream_body.size() > 400 ? stream_body.size() - 400 : 0);
  EXPECT_NE(stream_body.find("data: [DONE]"), std::string::npos);
}

TEST_F(ServeProcessTest, SigtermLeavesNothingBehindOneRank) {
  ExpectSigtermLeavesNothing({"-t", "1"}, 1);
}

TEST_F(ServeProcessTest, SigtermLeavesNothingBehindTp2) {
  ExpectSigtermLeavesNothing({"-t", "1", "--tp", "2"}, 2);
}

TEST_F(ServeProcessTest, Tp2MatchesOneRankBitForBit) {
  ServerProcess one, two;
  ASSERT_TRUE(one.Start({"-t", "1"}));
  ASSERT_TRUE(two.Start({"-t", "1", "--tp", "2"}));
  for (const std::string& prompt : Prompts(8)) {
    for (bool stream : {false, true}) {
      json request = Greedy(prompt, 16);
      request["logprobs"] = 5;
      request["stream"] = stream;
      const Completion a = Complete(one, request);
      const Completion b = Complete(two, request);
      ASSERT_EQ(a.status, 200) << a.body;
      ASSERT_EQ(b.status, 200) << b.body;
      EXPECT_EQ(a.text, b.text) << prompt;
      EXPECT_EQ(a.tokens, b.tokens) << prompt;
      EXPECT_EQ(a.token_logprobs, b.token_logprobs) << prompt;
      if (!stream) {  // the top-5 alternatives and their values too
        EXPECT_EQ(json::parse(a.body)["choices"][0]["logprobs"]["top_logprobs"],
                  json::parse(b.body)["choices"][0]["logprobs"]["top_logprobs"])
            << prompt;
      }
    }
  }
  EXPECT_EQ(two.Stop(std::chrono::seconds(10)), 0) << two.Log();
  EXPECT_EQ(one.Stop(std::chrono::seconds(10)), 0) << one.Log();
}

// 256 streaming clients at once: each completes with [DONE] or is refused with
// 429; the server stays healthy and its resident memory stays under kRssBoundMib.
TEST_F(ServeProcessTest, ManyConcurrentStreams) {
  constexpr int kClients = 256;
  constexpr int64_t kRssBoundMib = 256;  // measured: ~13 MiB idle, ~24 MiB peak
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--http-threads", "300"}));
  const int64_t rss_start_kib = RssKib(server.pid());
  std::atomic<int64_t> rss_peak_kib{rss_start_kib};
  std::atomic<bool> running{true};
  std::thread sampler([&] {
    while (running) {
      rss_peak_kib = std::max<int64_t>(rss_peak_kib, RssKib(server.pid()));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::vector<Completion> results(kClients);
  std::vector<std::thread> clients;
  const std::vector<std::string> prompts = Prompts(32);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      json request = Greedy(prompts[i % 32], 8);
      request["stream"] = true;
      results[i] = Complete(server, request);
    });
  }
  for (std::thread& t : clients) t.join();
  running = false;
  sampler.join();
  int completed = 0, refused = 0;
  for (int i = 0; i < kClients; ++i) {
    const Completion& c = results[i];
    if (c.status == 429) {
      ++refused;
      continue;
    }
    EXPECT_EQ(c.status, 200) << "client " << i << ": " << c.body;
    if (c.status != 200) continue;
    EXPECT_TRUE(c.done) << "client " << i << ": " << c.body;
    EXPECT_FALSE(c.finish_reason.empty()) << "client " << i;
    ++completed;
  }
  std::printf(
      "%d streams completed, %d refused with 429; server VmRSS %lld KiB at start, "
      "%lld KiB peak\n",
      completed, refused, static_cast<long long>(rss_start_kib),
      static_cast<long long>(rss_peak_kib.load()));
  EXPECT_GT(completed, 0);
  EXPECT_LT(rss_peak_kib.load(), kRssBoundMib * 1024);
  httplib::Client client = server.Client();
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Complete(server, Greedy("Once", 4)).status, 200);
  EXPECT_EQ(WaitForKvBlocksFree(server), 0);
  const std::string m = Metrics(server);  // after the step that freed the blocks
  EXPECT_EQ(MetricValue(m, "tessera_num_requests_running"), 0) << m;
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
}

// A value of a process's environment ("" when absent).
std::string EnvironValue(pid_t pid, const std::string& key) {
  std::string text = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  for (char& c : text) c = c == '\0' ? '\n' : c;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

// The pid of rank `rank` among the server's rank processes, or -1.
pid_t RankPid(const ServerProcess& server, int rank) {
  for (pid_t child : ChildrenOf(server.pid())) {
    if (ProcessExists(child) && EnvironValue(child, "RANK") == std::to_string(rank)) return child;
  }
  return -1;
}

// Supervision over --tp 2 and --pp 2: the rank that is not the driver killed (-9) in the middle of
// a stream, then frozen (SIGSTOP) while idle. Each time the launcher restarts it, the server stays
// up, and the stream in flight completes with exactly the text it gets without a fault (the running
// sequence is recomputed, not restarted); a request sent to the frozen engine completes once it is
// back. Afterwards: /health ok, two restarts counted, and SIGTERM leaves no rank and no shared
// memory of any epoch behind.
void ExpectDeadAndFrozenRanksAreRestarted(const std::vector<std::string>& layout, int worker) {
  std::vector<std::string> flags = {"-t", "1"};
  flags.insert(flags.end(), layout.begin(), layout.end());
  ::setenv("TESSERA_COMM_FROZEN_MS", "1500", 1);
  ServerProcess server;
  const ::testing::AssertionResult started = server.Start(flags);
  ::unsetenv("TESSERA_COMM_FROZEN_MS");
  ASSERT_TRUE(started);
  const std::string job = EnvironValue(RankPid(server, worker), "TESSERA_JOB_ID");
  ASSERT_FALSE(job.empty());
  json request = Greedy("Once upon a time", 400);
  request["ignore_eos"] = true;
  const Completion reference = Complete(server, request);
  ASSERT_EQ(reference.status, 200) << reference.body;

  // kill -9 of the worker while a stream is being generated.
  const pid_t first = RankPid(server, worker);
  ASSERT_GT(first, 0);
  std::atomic<bool> streaming{false};
  Completion streamed;
  std::thread client([&] {
    json r = request;
    r["stream"] = true;
    httplib::Client c = server.Client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body = r.dump();
    std::string body;
    req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      body.append(data, size);
      streaming = body.size() > 600;  // a few tokens went out before the fault
      return true;
    };
    httplib::Result res = c.send(req);
    streamed.status = res ? res->status : 0;
    for (const std::string& data : SseData(body)) {
      if (data == "[DONE]") {
        streamed.done = true;
        continue;
      }
      const json chunk = json::parse(data);
      if (!chunk["choices"].empty())
        streamed.text += chunk["choices"][0]["text"].get<std::string>();
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!streaming && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(streaming.load()) << server.Log();
  ::kill(first, SIGKILL);
  client.join();
  EXPECT_EQ(streamed.status, 200) << server.Log();
  EXPECT_TRUE(streamed.done) << server.Log();
  EXPECT_EQ(streamed.text, reference.text);

  // SIGSTOP of the restarted worker, idle: the next request still completes.
  pid_t second = -1;
  for (auto until = Clock::now() + std::chrono::seconds(20); Clock::now() < until;) {
    second = RankPid(server, worker);
    if (second > 0 && second != first) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(second, 0);
  ASSERT_NE(second, first);
  ::kill(second, SIGSTOP);
  const auto frozen_at = Clock::now();
  const Completion after = Complete(server, Greedy("Once upon a time", 400));
  const double recovery_s = std::chrono::duration<double>(Clock::now() - frozen_at).count();
  EXPECT_EQ(after.status, 200) << after.body << "\n" << server.Log();
  EXPECT_EQ(after.text, reference.text);
  EXPECT_LT(recovery_s, 30.0);
  std::printf("request to a frozen rank answered after %.2f s (frozen threshold 1.5 s)\n",
              recovery_s);

  httplib::Client c = server.Client();
  httplib::Result health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;
  EXPECT_EQ(MetricValue(Metrics(server), "tessera_engine_restarts_total"), 2) << server.Log();
  std::vector<pid_t> ranks = ChildrenOf(server.pid());
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();
  for (pid_t rank : ranks) EXPECT_FALSE(ProcessExists(rank)) << "rank pid " << rank << " left";
  const std::vector<std::string> left = ShmNamesWithPrefix("tessera-" + job);
  EXPECT_TRUE(left.empty()) << left.size() << " shm segments left, e.g. " << left[0];
}

TEST_F(ServeProcessTest, DeadAndFrozenRanksAreRestartedWithoutLosingRequestsTp2) {
  ExpectDeadAndFrozenRanksAreRestarted({"--tp", "2"}, /*worker=*/1);  // rank 0 drives
}

TEST_F(ServeProcessTest, DeadAndFrozenRanksAreRestartedWithoutLosingRequestsPp2) {
  ExpectDeadAndFrozenRanksAreRestarted({"--pp", "2"}, /*worker=*/0);  // the last stage drives
}

}  // namespace
}  // namespace tessera::serve
