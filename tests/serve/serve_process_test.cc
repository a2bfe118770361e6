// `tessera serve` as a real process on loopback (fork/exec of the CLI on a port
// picked here), on ../shared/models/stories260K.gguf: completions streamed and
// not, concurrent clients and a tiny KV budget (preemption) giving each request
// its single-request greedy output, a disconnect freeing its KV blocks, auth, bad
// input, SIGTERM leaving no process or shared memory behind, --tp 2 equal to one
// rank bit for bit, and 256 concurrent streams with bounded memory.
#include "serve_process.h"

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
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::serve {
namespace {

using namespace process_test;  // NOLINT(google-build-using-namespace): test helpers

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

// Live expert re-placement (--ep-rebalance): on a MoE whose router favours a
// quarter of its experts, the server moves copies of the hot experts between steps
// as it serves, and every completion is still that of a server whose experts
// never move, token for token and logprob for logprob. `ep` lays the experts out.
void ExpectLiveReplacementKeepsTheOutputs(const std::vector<std::string>& ep) {
  // Named after the test: the two callers may run at once (ctest -j), and one's synth
  // must not overwrite the file the other's servers have mapped.
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string model = ::testing::TempDir() + "/serve-skewed-moe-" + test + ".gguf";
  const std::string synth = std::string(TESSERA_CLI_PATH) +
                            " synth --arch moe --dim 64 --layers 2 --heads 4 --ffn 128 "
                            "--experts 8 --experts-used 2 --type q8_0 --router-skew 0.8 "
                            "--vocab-from " +
                            ModelPath() + " -o " + model + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(synth.c_str()), 0) << synth;
  // Without replica slots there is nothing to move: refused before any rank starts.
  const std::string refused_log =
      ::testing::TempDir() + "/serve-rebalance-refused-" + test + ".log";
  const std::string refused = std::string(TESSERA_CLI_PATH) + " serve " + model +
                              " --port 0 --ep 2 --ep-rebalance 5 > " + refused_log + " 2>&1";
  EXPECT_NE(std::system(refused.c_str()), 0);
  EXPECT_NE(ReadFile(refused_log).find("--ep-rebalance moves copies of hot experts"),
            std::string::npos)
      << ReadFile(refused_log);
  std::vector<std::string> fixed_flags = ep, live_flags = ep;
  fixed_flags.insert(fixed_flags.end(), {"--ep-rebalance", "0"});
  live_flags.insert(live_flags.end(), {"--ep-rebalance", "0.2", "--ep-rebalance-min-rows", "200"});
  ServerProcess fixed, live;
  ASSERT_TRUE(fixed.Start(fixed_flags, model));
  ASSERT_TRUE(live.Start(live_flags, model));
  int rounds_after = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (rounds_after < 2 && Clock::now() < deadline) {
    if (MetricValue(Metrics(live), "tessera_ep_rebalances_total") >= 1) ++rounds_after;
    for (const std::string& prompt : Prompts(8)) {
      json request = Greedy(prompt, 24);
      request["logprobs"] = 3;
      const Completion a = Complete(fixed, request);
      const Completion b = Complete(live, request);
      ASSERT_EQ(a.status, 200) << a.body << fixed.Log();
      ASSERT_EQ(b.status, 200) << b.body << live.Log();
      EXPECT_EQ(a.tokens, b.tokens) << prompt;
      EXPECT_EQ(a.token_logprobs, b.token_logprobs) << prompt;
    }
  }
  EXPECT_EQ(rounds_after, 2) << "no re-placement within 90 s:\n" << live.Log();
  const std::string m = Metrics(live);
  EXPECT_LT(MetricValue(m, "tessera_ep_busiest_over_mean{placement=\"after\"}"),
            MetricValue(m, "tessera_ep_busiest_over_mean{placement=\"before\"}"))
      << m;
  EXPECT_NE(live.Log().find("experts re-placed"), std::string::npos) << live.Log();
  EXPECT_EQ(MetricValue(Metrics(fixed), "tessera_ep_rebalances_total"), 0);
  EXPECT_EQ(live.Stop(std::chrono::seconds(10)), 0) << live.Log();
  EXPECT_EQ(fixed.Stop(std::chrono::seconds(10)), 0) << fixed.Log();
  fs::remove(model);
}

TEST_F(ServeProcessTest, LiveExpertReplacementKeepsTheOutputs) {
  ExpectLiveReplacementKeepsTheOutputs(
      {"-t", "1", "--tp", "2", "--ep", "2", "--ep-redundant", "2"});
}

// The same under data-parallel attention: each rank's own requests' tokens reach the
// experts' ranks, whose load summed over both ranks drives the re-placement.
TEST_F(ServeProcessTest, LiveExpertReplacementKeepsTheOutputsUnderDpAttention) {
  ExpectLiveReplacementKeepsTheOutputs(
      {"-t", "1", "--ep", "2", "--dp-attention", "--ep-redundant", "2"});
}

// The live view over tp 2 x pp 2: every rank's report arrives while the workers
// go on serving (Driver::PollReports through the pipeline), with its time split,
// its groups and its ledger; the page and its files are served; --no-ui turns
// them off and leaves the API.
TEST_F(ServeProcessTest, LiveViewShowsEveryRankTp2Pp2) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"-t", "1", "--tp", "2", "--pp", "2"}));
  httplib::Client client = server.Client();
  httplib::Result page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script src=\"/ui/app.js\">"), std::string::npos);
  for (const char* path : {"/ui/app.js", "/ui/style.css"}) {
    httplib::Result res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_GT(res->body.size(), 500u) << path;
  }
  // The first sample is taken before any request: four ranks, no steps yet.
  httplib::Result first = client.Get("/ui/state");
  ASSERT_TRUE(first);
  json state = json::parse(first->body, nullptr, false);
  ASSERT_TRUE(state.is_object()) << first->body;
  ASSERT_EQ(state["ranks"].size(), 4u) << first->body;
  EXPECT_EQ(state["plan"].get<std::string>().rfind("tp2 pp2", 0), 0u) << state["plan"];

  // Two requests more than a second apart: the second poll has an interval to show.
  for (int i = 0; i < 2; ++i) {
    const Completion c = Complete(server, Greedy("Once upon a time", 24));
    ASSERT_EQ(c.status, 200) << c.body;
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  ASSERT_EQ(Complete(server, Greedy("The cat", 24)).status, 200);
  httplib::Result res = client.Get("/ui/state");
  ASSERT_TRUE(res);
  state = json::parse(res->body, nullptr, false);
  ASSERT_TRUE(state.is_object()) << res->body;
  ASSERT_EQ(state["ranks"].size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const json& rank = state["ranks"][r];
    EXPECT_EQ(rank["rank"], r);
    EXPECT_EQ(rank["stage"], r / 2) << rank;
    EXPECT_EQ(rank["tp_rank"], r % 2) << rank;
    EXPECT_GT(rank["total"]["steps"].get<int64_t>(), 24) << rank;  // every rank ran every step
    EXPECT_GT(rank["total"]["compute_s"].get<double>(), 0) << rank;
    EXPECT_GT(rank["total"]["comm_s"].get<double>(), 0) << rank;
    ASSERT_TRUE(rank["interval"].is_object()) << rank;
    EXPECT_GT(rank["interval"]["steps"].get<int64_t>(), 0) << rank;
    EXPECT_GT(rank["interval"]["seconds"].get<double>(), 0.9) << rank;
  }
  EXPECT_EQ(state["groups"].size(), 4u) << state["groups"];  // 2 tp groups, 2 pipelines
  std::map<std::string, json> ledger;
  for (const json& row : state["ledger"]) {
    ledger[row["group"].get<std::string>() + "/" + row["primitive"].get<std::string>()] = row;
  }
  ASSERT_TRUE(ledger.contains("tp/all_reduce")) << state["ledger"];
  ASSERT_TRUE(ledger.contains("pp/send")) << state["ledger"];
  for (int r = 0; r < 4; ++r) {  // the two ranks of a stage all-reduce the same bytes
    EXPECT_EQ(ledger["tp/all_reduce"]["bytes_sent_by_rank"][r],
              ledger["tp/all_reduce"]["bytes_sent_by_rank"][r - r % 2]);
    EXPECT_GT(ledger["tp/all_reduce"]["bytes_sent_by_rank"][r].get<int64_t>(), 0);
  }
  // Stage 0 sends activations to stage 1; stage 1 sends none.
  EXPECT_GT(ledger["pp/send"]["bytes_sent_by_rank"][0].get<int64_t>(), 0);
  EXPECT_EQ(ledger["pp/send"]["bytes_sent_by_rank"][2].get<int64_t>(), 0);
  EXPECT_EQ(state["latency"]["last_minute"]["requests"], 3);

  // Under a steady load that keeps both stages busy the ranks are still polled
  // about once a second (a due poll drains the pipeline).
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&server, &stop, i] {
      json request = Greedy("Once upon a time " + std::to_string(i), 300);
      request["ignore_eos"] = true;
      while (!stop.load()) Complete(server, request);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  int64_t steps_before = -1;
  for (int read = 0; read < 2; ++read) {
    httplib::Result loaded = client.Get("/ui/state");
    ASSERT_TRUE(loaded);
    const json busy = json::parse(loaded->body, nullptr, false);
    ASSERT_TRUE(busy.is_object());
    EXPECT_LT(busy["ranks_age_s"].get<double>(), 1.5) << busy["ranks"];
    const int64_t steps = busy["ranks"][3]["total"]["steps"].get<int64_t>();
    EXPECT_GT(steps, steps_before);
    steps_before = steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  }
  stop.store(true);
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(server.Stop(std::chrono::seconds(10)), 0) << server.Log();

  ServerProcess quiet;
  ASSERT_TRUE(quiet.Start({"-t", "1", "--no-ui"}));
  httplib::Client quiet_client = quiet.Client();
  for (const char* path : {"/", "/ui/state", "/ui/app.js"}) {
    httplib::Result r = quiet_client.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
  }
  EXPECT_EQ(Complete(quiet, Greedy("Once", 4)).status, 200);
  EXPECT_EQ(quiet.Stop(std::chrono::seconds(10)), 0) << quiet.Log();
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
