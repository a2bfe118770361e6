// `tessera serve --dp 2` as real processes on loopback (the front and its two
// replicas, on ../shared/models/stories260K.gguf): concurrent clients, streamed
// and not, get exactly the greedy output of a single replica under round-robin
// and least-outstanding; kill -9 of a replica in the middle of a load loses no
// accepted request (non-streamed ones complete with their single-replica text,
// streams complete or end with an error event after a prefix of it), /health says
// degraded, and the replica is restarted and serves again (also when the process
// killed is the driver rank of a --tp 2 replica); prefix-affinity sends
// each tenant's repeats to the replica that caches its prefix (every repeat hits).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"

namespace tessera::serve {
namespace {

using namespace process_test;  // NOLINT(google-build-using-namespace): test helpers

class DpProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }
  void SetUp() override {
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "no " << ModelPath();
  }
};

json Request(const std::string& prompt, int max_tokens, bool stream) {
  json r = Greedy(prompt, max_tokens);
  r["logprobs"] = 1;
  r["ignore_eos"] = true;
  r["stream"] = stream;
  return r;
}

// The single-replica answers to `prompts` (one plain server, one at a time).
std::vector<Completion> SingleReplicaAnswers(const std::vector<std::string>& prompts,
                                             int max_tokens,
                                             const std::string& model = ModelPath()) {
  ServerProcess single;
  EXPECT_TRUE(single.Start({"-t", "1"}, model));
  std::vector<Completion> out;
  for (const std::string& p : prompts) {
    out.push_back(Complete(single, Request(p, max_tokens, false)));
    EXPECT_EQ(out.back().status, 200) << out.back().body;
  }
  EXPECT_EQ(single.Stop(std::chrono::seconds(10)), 0) << single.Log();
  return out;
}

// Every prompt sent at once (half of them streamed), greedy, max_tokens each.
std::vector<Completion> AllAtOnce(const ServerProcess& front,
                                  const std::vector<std::string>& prompts, int max_tokens) {
  std::vector<Completion> out(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back(
        [&, i] { out[i] = Complete(front, Request(prompts[i], max_tokens, i % 2 == 1)); });
  }
  for (std::thread& t : clients) t.join();
  return out;
}

double SumOverReplicas(const std::string& metrics, const std::string& series, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const std::string prefix = "\n" + series + "{replica=\"" + std::to_string(i) + "\"";
    const size_t pos = metrics.find(prefix);
    if (pos == std::string::npos) return -1;
    sum += std::stod(metrics.substr(metrics.find("} ", pos) + 2));
  }
  return sum;
}

void ExpectConcurrentEqualsSingleReplica(const std::string& router) {
  const std::vector<std::string> prompts = Prompts(16);
  const std::vector<Completion> alone = SingleReplicaAnswers(prompts, 16);
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--dp", "2", "--router", router}));
  httplib::Result health = front.Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_NE(health->body.find("\"status\":\"ok\""), std::string::npos) << health->body;
  httplib::Result models = front.Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find("stories260K"), std::string::npos) << models->body;

  const std::vector<Completion> together = AllAtOnce(front, prompts, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(together[i].status, 200) << prompts[i] << ": " << together[i].body;
    EXPECT_EQ(together[i].text, alone[i].text) << prompts[i];
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << prompts[i];
    EXPECT_EQ(together[i].token_logprobs, alone[i].token_logprobs) << prompts[i];
  }
  // Both replicas served; a bad request gets the replica's own OpenAI error. A
  // replica publishes its counters once the step that finished a request ends,
  // which may be just after the client has its answer: scraped until its
  // generated tokens are all in (or 10 s).
  size_t generated = 0;
  for (const Completion& c : together) generated += c.tokens.size();
  std::string m = Metrics(front);
  for (const auto deadline = Clock::now() + std::chrono::seconds(10);
       SumOverReplicas(m, "tessera_generation_tokens_total", 2) != static_cast<double>(generated) &&
       Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = Metrics(front);
  }
  EXPECT_EQ(MetricValue(m, "tessera_dp_replicas_up"), 2) << m;
  const std::string first = "\ntessera_dp_replica_requests_total{replica=\"0\"";
  ASSERT_NE(m.find(first), std::string::npos) << m;
  EXPECT_GT(std::stod(m.substr(m.find("} ", m.find(first)) + 2)), 0) << m;
  EXPECT_EQ(SumOverReplicas(m, "tessera_dp_replica_requests_total", 2), 16) << m;
  // The replicas' own series, merged: their generated tokens add up.
  EXPECT_EQ(SumOverReplicas(m, "tessera_generation_tokens_total", 2), generated) << m;
  EXPECT_EQ(m.find("# TYPE tessera_generation_tokens_total"),
            m.rfind("# TYPE tessera_generation_tokens_total"))
      << m;
  const Completion bad = Complete(front, {{"prompt", "x"}, {"max_tokens", -1}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("max_tokens"), std::string::npos) << bad.body;
  EXPECT_EQ(front.Stop(std::chrono::seconds(20)), 0) << front.Log();
}

TEST_F(DpProcessTest, RoundRobinGivesTheSingleReplicaOutputs) {
  ExpectConcurrentEqualsSingleReplica("round-robin");
}

TEST_F(DpProcessTest, LeastOutstandingGivesTheSingleReplicaOutputs) {
  ExpectConcurrentEqualsSingleReplica("least-outstanding");
}

TEST_F(DpProcessTest, BadFlagsAreRefused) {
  ServerProcess front;
  const ::testing::AssertionResult started = front.Start({"--dp", "2", "--router", "random"});
  ASSERT_FALSE(started);
  EXPECT_NE(std::string(started.message()).find("--router must be"), std::string::npos)
      << started.message();
  const ::testing::AssertionResult remote = front.Start({"--replica", "localhost"});
  ASSERT_FALSE(remote);
  EXPECT_NE(std::string(remote.message()).find("not http://HOST:PORT"), std::string::npos)
      << remote.message();
  // The prefill/decode split's flags, refused before anything starts, naming them.
  const std::vector<std::pair<std::vector<std::string>, std::string>> pd_cases = {
      {{"--pd-join", "127.0.0.1:1", "--pd-role", "decode"}, "--pd-role 'decode' is not"},
      {{"--pd-join", "127.0.0.1:1"}, "--pd-join and --pd-role go together"},
      {{"--pd", "0:1"}, "at least one prefill and one decode instance"},
      {{"--pd-decode", "http://127.0.0.1:1"}, "go with --pd P:D"},
      {{"--decode-tp", "2"}, "--decode-tp go with --pd P:D"},
      {{"--pd", "1:1", "--prefill-tp", "-1"}, "--prefill-tp and --decode-tp must be >= 1"},
      // An instance's layout it cannot run yet: refused by the instance, named at the front.
      {{"--pd", "1:1", "--pp", "2"}, "not yet --pp, --cp or --dp-attention"},
      {{"--pd", "1:0", "--pd-decode", "http://127.0.0.1:1"}, "TESSERA_CLUSTER_TOKEN"}};
  ::unsetenv("TESSERA_CLUSTER_TOKEN");  // the last case: remote instances need one
  for (const auto& [flags, why] : pd_cases) {
    const ::testing::AssertionResult refused = front.Start(flags);
    ASSERT_FALSE(refused) << flags[0];
    EXPECT_NE(std::string(refused.message()).find(why), std::string::npos) << refused.message();
  }
}

// Every process below `root` (its children, theirs, …).
std::vector<pid_t> Descendants(pid_t root) {
  std::vector<pid_t> out = ChildrenOf(root);
  for (size_t i = 0; i < out.size(); ++i) {
    for (pid_t child : ChildrenOf(out[i])) out.push_back(child);
  }
  return out;
}

// Replicas that are groups themselves (--tp 2: a launcher and two ranks each):
// the same outputs, and SIGTERM to the front stops every process of every group.
TEST_F(DpProcessTest, Tp2ReplicasServeAndStopWithTheFront) {
  const std::vector<std::string> prompts = Prompts(4);
  const std::vector<Completion> alone = SingleReplicaAnswers(prompts, 16);
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--dp", "2", "--tp", "2"}));
  const std::vector<pid_t> group = Descendants(front.pid());
  EXPECT_EQ(group.size(), 6u);  // 2 launchers + 4 ranks
  const std::vector<Completion> together = AllAtOnce(front, prompts, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(together[i].status, 200) << together[i].body;
    EXPECT_EQ(together[i].token_logprobs, alone[i].token_logprobs) << prompts[i];
  }
  EXPECT_EQ(front.Stop(std::chrono::seconds(20)), 0) << front.Log();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto alive = [&] {
    int n = 0;
    for (pid_t pid : group) n += ProcessExists(pid) ? 1 : 0;
    return n;
  };
  while (alive() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(alive(), 0);
}

// Data-parallel attention (--dp 2 --ep 2 --dp-attention on the MoE model): one
// group of two ranks, each running its own requests' attention, the experts split
// over both. Concurrent requests get the single-rank outputs and logprobs.
TEST_F(DpProcessTest, DataParallelAttentionGivesTheSingleRankOutputs) {
  const std::string moe = std::string(TESSERA_SHARED_DIR) + "/models/stories260K-moe4x2.gguf";
  if (!fs::exists(moe)) GTEST_SKIP() << "no " << moe;
  const std::vector<std::string> prompts = Prompts(6);
  const std::vector<Completion> alone = SingleReplicaAnswers(prompts, 12, moe);
  ServerProcess group;
  ASSERT_TRUE(group.Start({"-t", "1", "--dp", "2", "--ep", "2", "--dp-attention"}, moe));
  EXPECT_EQ(Descendants(group.pid()).size(), 2u);  // the launcher's two ranks, no front
  const std::vector<Completion> together = AllAtOnce(group, prompts, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(together[i].status, 200) << together[i].body;
    EXPECT_EQ(together[i].text, alone[i].text) << prompts[i];
    EXPECT_EQ(together[i].token_logprobs, alone[i].token_logprobs) << prompts[i];
  }
  EXPECT_EQ(group.Stop(std::chrono::seconds(20)), 0) << group.Log();
  ServerProcess bad;
  const ::testing::AssertionResult refused =
      bad.Start({"--dp", "3", "--ep", "2", "--dp-attention"}, moe);
  ASSERT_FALSE(refused);
  EXPECT_NE(std::string(refused.message()).find("must equal --ep"), std::string::npos)
      << refused.message();
}

// --replica URL: a front over a server it did not start. While that replica is
// gone (the only one), /health says unavailable and a request gets 503 once
// --unavailable-after-s has passed.
TEST_F(DpProcessTest, RemoteReplicaIsRoutedToAndItsOutageAnswered503) {
  ServerProcess remote;
  ASSERT_TRUE(remote.Start({"-t", "1"}));
  const std::string url = "http://127.0.0.1:" + std::to_string(remote.port());
  const Completion direct = Complete(remote, Request("Once upon a time", 12, false));
  ASSERT_EQ(direct.status, 200) << direct.body;
  ServerProcess front;
  ASSERT_TRUE(front.Start({"--replica", url, "--unavailable-after-s", "1"}));
  EXPECT_TRUE(ChildrenOf(front.pid()).empty());  // nothing local
  Completion via = Complete(front, Request("Once upon a time", 12, true));
  ASSERT_EQ(via.status, 200) << via.body;
  EXPECT_EQ(via.token_logprobs, direct.token_logprobs);

  ASSERT_EQ(remote.Stop(std::chrono::seconds(10)), 0);
  std::string health;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (health.find("unavailable") == std::string::npos && Clock::now() < deadline) {
    if (httplib::Result h = front.Client().Get("/health")) health = h->body;
  }
  EXPECT_NE(health.find("\"replicas_up\":0"), std::string::npos) << health;
  const Completion refused = Complete(front, Request("Once upon a time", 12, false));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("no replica is up"), std::string::npos) << refused.body;
  EXPECT_EQ(MetricValue(Metrics(front), "tessera_dp_unavailable_total"), 1);
  EXPECT_EQ(front.Stop(std::chrono::seconds(20)), 0) << front.Log();
}

// A stream read by hand: its text, whether it ended with [DONE] and whether an
// error event came.
struct StreamResult {
  int status = 0;
  std::string text;
  bool done = false;
  std::string error;
};

StreamResult ReadStream(const std::string& body, int status) {
  StreamResult out;
  out.status = status;
  for (const std::string& data : SseData(body)) {
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    const json chunk = json::parse(data, nullptr, false);
    if (chunk.contains("error")) {
      out.error = chunk["error"].value("message", "?");
    } else if (chunk.contains("choices") && !chunk["choices"].empty()) {
      out.text += chunk["choices"][0]["text"].get<std::string>();
    }
  }
  return out;
}

// kill -9 of one replica while 24 requests (half streamed) run on both: every
// non-streamed one completes with its single-replica text; every stream either
// completes with it or (its replica died after it sent tokens) ends with an error
// event after a prefix of it; /health is degraded until the replica, restarted by
// the front, is back, and then it serves again.
// `victim`: given replica 0's process (a --tp replica's is its launcher), the
// process to kill.
void ExpectKilledReplicaLosesNothing(const std::vector<std::string>& flags,
                                     const std::function<pid_t(pid_t)>& victim) {
  constexpr int kRequests = 24, kTokens = 200;
  const std::vector<std::string> prompts = Prompts(kRequests);
  const std::vector<Completion> alone = SingleReplicaAnswers(prompts, kTokens);
  ServerProcess front;
  std::vector<std::string> args = {"-t", "1", "--dp", "2", "--http-threads", "64"};
  args.insert(args.end(), flags.begin(), flags.end());
  ASSERT_TRUE(front.Start(args));
  std::vector<pid_t> replicas = ChildrenOf(front.pid());
  ASSERT_EQ(replicas.size(), 2u);
  const pid_t killed = victim(replicas[0]);
  ASSERT_GT(killed, 0);

  // /health watched throughout.
  std::atomic<bool> watching{true}, saw_degraded{false};
  std::thread watcher([&] {
    while (watching) {
      httplib::Client c = front.Client();
      c.set_read_timeout(2, 0);
      if (httplib::Result h = c.Get("/health")) {
        if (h->body.find("degraded") != std::string::npos) saw_degraded = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });

  std::atomic<int> streams_with_data{0};
  std::vector<StreamResult> results(kRequests);
  std::vector<Completion> plain(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      const bool stream = i % 2 == 1;
      if (!stream) {
        plain[i] = Complete(front, Request(prompts[i], kTokens, false));
        return;
      }
      httplib::Client c = front.Client();
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.set_header("Content-Type", "application/json");
      req.body = Request(prompts[i], kTokens, true).dump();
      std::string body;
      bool counted = false;
      req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
        body.append(data, size);
        if (!counted && body.find("\"text\"") != std::string::npos) {
          counted = true;
          ++streams_with_data;
        }
        return true;
      };
      httplib::Result res = c.send(req);
      results[i] = ReadStream(body, res ? res->status : 0);
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (streams_with_data < 4 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(streams_with_data.load(), 4) << front.Log();
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  for (std::thread& t : clients) t.join();

  int broken = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (i % 2 == 0) {
      ASSERT_EQ(plain[i].status, 200) << prompts[i] << ": " << plain[i].body << front.Log();
      EXPECT_EQ(plain[i].text, alone[i].text) << prompts[i];
      EXPECT_EQ(plain[i].token_logprobs, alone[i].token_logprobs) << prompts[i];
      continue;
    }
    const StreamResult& s = results[i];
    ASSERT_EQ(s.status, 200) << prompts[i] << front.Log();
    EXPECT_TRUE(s.done) << prompts[i];
    if (s.error.empty()) {
      EXPECT_EQ(s.text, alone[i].text) << prompts[i];
    } else {
      ++broken;
      EXPECT_NE(s.error.find("failed after this stream had sent tokens"), std::string::npos)
          << s.error;
      EXPECT_EQ(alone[i].text.rfind(s.text, 0), 0u) << prompts[i] << ": not a prefix";
    }
  }
  // Back: the replica is restarted (a new process) and /health is ok again.
  const auto rejoin_deadline = Clock::now() + std::chrono::seconds(60);
  std::string m;
  while (Clock::now() < rejoin_deadline) {
    m = Metrics(front);
    if (MetricValue(m, "tessera_dp_replicas_up") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  watching = false;
  watcher.join();
  EXPECT_TRUE(saw_degraded.load());
  ASSERT_EQ(MetricValue(m, "tessera_dp_replicas_up"), 2) << m << front.Log();
  EXPECT_EQ(SumOverReplicas(m, "tessera_dp_replica_restarts_total", 2), 1) << m;
  EXPECT_EQ(SumOverReplicas(m, "tessera_dp_replica_down_total", 2), 1) << m;
  EXPECT_EQ(MetricValue(m, "tessera_dp_broken_streams_total"), broken) << m;
  EXPECT_GT(MetricValue(m, "tessera_dp_reruns_total"), 0) << m;
  replicas = ChildrenOf(front.pid());
  ASSERT_EQ(replicas.size(), 2u);
  httplib::Result health = front.Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_NE(health->body.find("\"status\":\"ok\""), std::string::npos) << health->body;
  // The restarted replica serves: a few requests in a row reach both.
  const double before = SumOverReplicas(m, "tessera_dp_replica_requests_total", 2);
  for (int i = 0; i < 4; ++i) {
    const Completion c = Complete(front, Request(prompts[0], 8, false));
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(alone[0].text.rfind(c.text, 0), 0u);
  }
  m = Metrics(front);
  EXPECT_EQ(SumOverReplicas(m, "tessera_dp_replica_requests_total", 2), before + 4) << m;
  const std::vector<pid_t> group = Descendants(front.pid());
  EXPECT_EQ(front.Stop(std::chrono::seconds(20)), 0) << front.Log();
  for (pid_t pid : group) EXPECT_FALSE(ProcessExists(pid)) << pid;
}

TEST_F(DpProcessTest, KilledReplicaLosesNoAcceptedRequestAndRejoins) {
  ExpectKilledReplicaLosesNothing({}, [](pid_t replica) { return replica; });
}

// A --tp 2 replica is a launcher and its two ranks; kill -9 of its driver rank (the
// one serving HTTP) takes the replica down the same way: its launcher stops the
// other rank and exits, the front re-runs what had sent nothing and restarts it.
TEST_F(DpProcessTest, KilledDriverOfATp2ReplicaLosesNoAcceptedRequestAndRejoins) {
  ExpectKilledReplicaLosesNothing({"--tp", "2"}, [](pid_t launcher) -> pid_t {
    for (pid_t rank : ChildrenOf(launcher)) {
      std::istringstream env(ReadFile("/proc/" + std::to_string(rank) + "/environ"));
      for (std::string entry; std::getline(env, entry, '\0');) {
        if (entry == "RANK=0") return rank;
      }
    }
    return -1;
  });
}

// Prefix-affinity: four tenants, each a long shared prefix, asked twice in a row
// (t0 t0 t1 t1 …, so that alternating would send every repeat elsewhere): each
// repeat goes where its prefix is cached and hits every full block but the last.
TEST_F(DpProcessTest, PrefixAffinitySendsRepeatsToTheReplicaThatCachesThem) {
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--dp", "2", "--router", "prefix-affinity"}));
  const char* tenants[] = {"Once upon a time there was a little girl named Lily. ",
                           "The big brown dog ran to the park every day. ",
                           "Tom had a red ball and a blue car. ",
                           "One day, a bird flew over the tall green tree. "};
  for (const char* tenant : tenants) {
    std::string prefix;
    for (int k = 0; k < 6; ++k) prefix += tenant;
    for (int turn = 0; turn < 2; ++turn) {
      json r = Greedy(prefix + (turn == 0 ? "She" : "He"), 4);
      httplib::Result res = front.Client().Post("/v1/completions", r.dump(), "application/json");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      const json body = json::parse(res->body);
      const int64_t prompt_tokens = body["usage"]["prompt_tokens"];
      const int64_t cached = body["usage"]["prompt_tokens_details"]["cached_tokens"];
      if (turn == 1) {
        // The prefix's full blocks (the last prompt token is always computed).
        EXPECT_GE(cached, (prompt_tokens - 1) / 16 * 16 - 16) << tenant << res->body;
        EXPECT_GT(cached, 0) << tenant;
      }
    }
  }
  // The replicas' cache events reach the front within a poll (50 ms).
  std::string m;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  do {
    m = Metrics(front);
  } while (SumOverReplicas(m, "tessera_dp_replica_cached_blocks", 2) <= 0 &&
           Clock::now() < deadline);
  EXPECT_GT(MetricValue(m, "tessera_dp_router_matched_blocks_total"), 0) << m;
  EXPECT_GT(SumOverReplicas(m, "tessera_dp_replica_cached_blocks", 2), 0) << m;
  EXPECT_EQ(front.Stop(std::chrono::seconds(20)), 0) << front.Log();
}

}  // namespace
}  // namespace tessera::serve
