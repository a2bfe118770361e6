// `tessera serve --pd 1:1` as real processes on loopback (the front, one prefill
// and one decode instance, on ../shared/models/stories260K.gguf): every request's
// prompt is computed on the prefill instance and its KV blocks sent to the
// decode instance, whose output — text and every logprob — is bit-identical to a
// plain single-process serve of the same requests; each request's transferred
// bytes equal the planner's KvTransferBytes for the tokens sent (a prefix the
// decode instance caches is not sent again); kill -9 of the
// prefill instance under load loses no request (the decode instance computes
// the prompts whose transfer failed), nor does a frozen one (transfers time
// out), and once restarted it prefills again; kill -9 of one of two decode
// instances loses no request either (re-run on the other, a new transfer);
// --kv-transfer-dtype f16 stays bit-identical, q8_0 and fp8 send the planner's
// bytes for their dtype and move the logprobs a little.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/config.h"
#include "model/gguf.h"
#include "plan/dtype.h"
#include "plan/model_shape.h"
#include "plan/traffic.h"
#include "serve_process.h"

namespace tessera::serve {
namespace {

using namespace process_test;  // NOLINT(google-build-using-namespace): test helpers

class PdProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }
  void SetUp() override {
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "no " << ModelPath();
  }
};

json Request(const std::string& prompt, int max_tokens) {
  json r = Greedy(prompt, max_tokens);
  r["logprobs"] = 1;
  r["ignore_eos"] = true;
  return r;
}

// One plain server's answers to `prompts` (the reference every PD layout must equal).
std::vector<Completion> AloneAnswers(const std::vector<std::string>& prompts, int max_tokens,
                                     const std::vector<std::string>& flags = {"-t", "1"},
                                     const std::string& model = ModelPath()) {
  std::vector<Completion> alone;
  ServerProcess single;
  const ::testing::AssertionResult started = single.Start(flags, model);
  EXPECT_TRUE(started);
  if (!started) return alone;
  for (const std::string& p : prompts) alone.push_back(Complete(single, Request(p, max_tokens)));
  EXPECT_EQ(single.Stop(std::chrono::seconds(10)), 0) << single.Log();
  return alone;
}

// Prompts of different lengths (most beyond one 16-token block), distinct from
// their first block on so that no prefix cache serves one from another.
std::vector<std::string> LongPrompts(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string p = "Story " + std::to_string(i) + ": once upon a time";
    for (int k = 0; k < i % 5 + 1; ++k) {
      p += " there was a little girl named Lily who liked to play in the park with her dog";
    }
    out.push_back(p);
  }
  return out;
}

// The planner's bytes for `tokens` tokens of stories260K's KV cache in `dtype`.
int64_t PlannedBytes(int64_t tokens, const std::string& dtype = "f16") {
  Result<model::GgufFile> file = model::GgufFile::Open(ModelPath());
  EXPECT_TRUE(file.ok());
  Result<model::ModelConfig> config = model::ModelConfigFromGguf(*file);
  EXPECT_TRUE(config.ok());
  plan::ModelShape shape;
  shape.num_layers = config->num_layers;
  shape.num_kv_heads = config->num_kv_heads;
  shape.head_dim = config->head_dim;
  Result<plan::DType> type = plan::ParseDType(dtype);
  EXPECT_TRUE(type.ok());
  return plan::KvTransferBytes(shape, *type, tokens);
}

// The value of `name` in process `pid`'s environment ("" when unset).
std::string EnvOf(pid_t pid, const std::string& name) {
  const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = name + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (env.compare(at, key.size(), key) == 0)
      return env.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}

// The front's local prefill instance (its TESSERA_PD_ROLE is "prefill:…"), or -1.
pid_t PrefillInstance(pid_t front) {
  for (pid_t child : ChildrenOf(front)) {
    if (EnvOf(child, "TESSERA_PD_ROLE").starts_with("prefill:")) return child;
  }
  return -1;
}

TEST_F(PdProcessTest, DecodeOutputIsBitIdenticalToOneServerAndBytesArePlanned) {
  constexpr int kRequests = 8, kTokens = 24;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens);
  ASSERT_EQ(alone.size(), prompts.size());
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--pd", "1:1", "--http-threads", "32"}));
  ASSERT_EQ(ChildrenOf(front.pid()).size(), 2u);
  std::vector<Completion> pd(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] { pd[i] = Complete(front, Request(prompts[i], kTokens)); });
  }
  for (std::thread& t : clients) t.join();
  int64_t transferred = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(pd[i].status, 200) << pd[i].body;
    EXPECT_EQ(pd[i].text, alone[i].text) << i;
    EXPECT_EQ(pd[i].token_logprobs, alone[i].token_logprobs) << i;  // bit for bit
    const json usage = json::parse(pd[i].body)["usage"];
    const int64_t prompt_tokens = usage["prompt_tokens"];
    const int64_t full = (prompt_tokens - 1) / 16 * 16;  // whole blocks, >= 1 token left
    ASSERT_TRUE(usage.contains("tessera_kv_transfer")) << pd[i].body << front.Log();
    EXPECT_EQ(usage["tessera_kv_transfer"]["tokens"], full);
    EXPECT_EQ(usage["tessera_kv_transfer"]["bytes"], PlannedBytes(full)) << i;
    transferred += PlannedBytes(full);
  }
  EXPECT_GT(transferred, 0);
  // The front's /metrics carries both instances' own series.
  const std::string metrics = Metrics(front);
  EXPECT_EQ(MetricValue(metrics, "tessera_pd_kv_exports_total{replica=\"0\"}"), kRequests)
      << metrics;
  EXPECT_EQ(MetricValue(metrics, "tessera_pd_kv_transfer_bytes_total{replica=\"1\"}"), transferred)
      << metrics;

  // A cached prefix is not sent again: the same prompt again transfers nothing
  // (the decode instance's prefix cache has its blocks), a longer one only its
  // new blocks.
  const Completion again = Complete(front, Request(prompts[3], 4));
  ASSERT_EQ(again.status, 200) << again.body;
  const json again_usage = json::parse(again.body)["usage"];
  const int64_t full3 = (again_usage["prompt_tokens"].get<int64_t>() - 1) / 16 * 16;
  EXPECT_FALSE(again_usage.contains("tessera_kv_transfer")) << again.body;
  EXPECT_EQ(again_usage["prompt_tokens_details"]["cached_tokens"], full3);
  const Completion longer = Complete(
      front, Request(prompts[3] + " and then they all went home to eat a big cake together", 4));
  ASSERT_EQ(longer.status, 200) << longer.body;
  const json longer_usage = json::parse(longer.body)["usage"];
  const int64_t full_longer = (longer_usage["prompt_tokens"].get<int64_t>() - 1) / 16 * 16;
  ASSERT_GT(full_longer, full3);
  ASSERT_TRUE(longer_usage.contains("tessera_kv_transfer")) << longer.body;
  EXPECT_EQ(longer_usage["tessera_kv_transfer"]["tokens"], full_longer - full3) << longer.body;
  EXPECT_EQ(longer_usage["tessera_kv_transfer"]["bytes"], PlannedBytes(full_longer - full3));
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
}

// --kv-transfer-dtype: f16 (the cache's own dtype) stays bit-identical; q8_0, fp8
// e4m3 and mxfp8 send the planner's bytes for that dtype and move the logprobs a little
// (the largest move is printed; docs/results.md has the measurement).
TEST_F(PdProcessTest, TransferDtypesSendThePlannedBytesAndMoveLogprobsLittle) {
  constexpr int kRequests = 6, kTokens = 24;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens);
  ASSERT_EQ(alone.size(), prompts.size());
  for (const std::string dtype : {"f16", "q8_0", "fp8_e4m3", "mxfp8"}) {
    ServerProcess front;
    ASSERT_TRUE(front.Start({"-t", "1", "--pd", "1:1", "--kv-transfer-dtype", dtype}));
    double worst = 0;
    int same_text = 0;
    for (int i = 0; i < kRequests; ++i) {
      const Completion c = Complete(front, Request(prompts[i], kTokens));
      ASSERT_EQ(c.status, 200) << c.body;
      const json usage = json::parse(c.body)["usage"];
      const int64_t full = (usage["prompt_tokens"].get<int64_t>() - 1) / 16 * 16;
      ASSERT_TRUE(usage.contains("tessera_kv_transfer")) << c.body;
      EXPECT_EQ(usage["tessera_kv_transfer"]["bytes"],
                PlannedBytes(full, dtype == "fp8_e4m3" ? "fp8" : dtype))
          << dtype;
      same_text += c.text == alone[i].text ? 1 : 0;
      // Until the first differing token, the logprobs compare position by position.
      for (size_t t = 0; t < c.token_logprobs.size() && t < alone[i].token_logprobs.size(); ++t) {
        if (c.tokens[t] != alone[i].tokens[t]) break;
        worst = std::max(worst, std::fabs(c.token_logprobs[t] - alone[i].token_logprobs[t]));
      }
      if (dtype == "f16") {
        EXPECT_EQ(c.token_logprobs, alone[i].token_logprobs) << i;
        EXPECT_EQ(c.text, alone[i].text) << i;
      }
    }
    std::fprintf(stderr,
                 "--kv-transfer-dtype %s: max |logprob change| %.6f, %d of %d texts equal\n",
                 dtype.c_str(), worst, same_text, kRequests);
    if (dtype != "f16") EXPECT_LT(worst, 0.5) << dtype;
    EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
  }
}

// A prompt's K/V streams to the decode instance while its prefill runs: under
// small prefill chunks (a 32-token step budget) as each step makes blocks final,
// and within one step — a whole prompt in one chunk (the default 512-token budget)
// — layer by layer, each layer's pieces as soon as its attention has written them
// (on a tp=2 prefill instance, each rank's heads gathered inside the step).
// Bytes arrive before the prefill ends (usage.tessera_kv_transfer.streamed_bytes,
// and the decode instance's tessera_pd_kv_streamed_bytes_total), in the cache's
// dtype and converted, and the output is still bit-identical (f16) to one
// server's. How much streams early depends on when the link thread runs (a loaded
// machine may merge bursts), so the streamed bytes are checked over the four
// requests, not each.
TEST_F(PdProcessTest, PrefillStreamsKvBeforeItEndsByChunkAndByLayer) {
  constexpr int kRequests = 4, kTokens = 8;
  std::vector<std::string> prompts;
  for (const std::string& p : LongPrompts(10)) {
    if (prompts.size() < kRequests && p.size() > 300) prompts.push_back(p);  // > 4 chunks
  }
  ASSERT_EQ(prompts.size(), static_cast<size_t>(kRequests));
  // A model whose 32-token step takes milliseconds, a prompt tens of them
  // (stories260K's step takes less than the prefill side's idle poll, so its
  // bursts could all merge into the last).
  const std::string model =
      ::testing::TempDir() + "/pd-streaming-synth-" + std::to_string(::getpid()) + ".gguf";
  const std::string synth = std::string(TESSERA_CLI_PATH) +
                            " synth --dim 384 --layers 8 --heads 6 --ffn 1024 --type q8_0 "
                            "--vocab-from " +
                            ModelPath() + " -o " + model + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(synth.c_str()), 0) << synth;
  const std::vector<std::string> chunked = {
      "-t", "1", "--max-num-batched-tokens", "32", "--max-num-seqs", "8"};
  const std::vector<std::string> one_step = {"-t", "1", "--max-num-seqs", "8"};
  std::vector<std::string> one_step_tp2 = one_step;
  one_step_tp2.insert(one_step_tp2.end(), {"--prefill-tp", "2"});
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens, chunked, model);
  ASSERT_EQ(alone.size(), prompts.size());
  struct Case {
    std::string dtype;
    const std::vector<std::string>& flags;
    std::string how;
  };
  for (const Case& run : {Case{"f16", chunked, "chunked"}, Case{"q8_0", chunked, "chunked"},
                          Case{"f16", one_step, "in one step"},
                          Case{"f16", one_step_tp2, "in one step on a tp=2 prefill instance"}}) {
    const std::string name = run.dtype + " " + run.how;
    std::vector<std::string> flags = run.flags;
    flags.insert(flags.end(), {"--pd", "1:1", "--kv-transfer-dtype", run.dtype});
    ServerProcess front;
    ASSERT_TRUE(front.Start(flags, model));
    int64_t streamed = 0, bytes = 0;
    for (int i = 0; i < kRequests; ++i) {
      const Completion c = Complete(front, Request(prompts[i], kTokens));
      ASSERT_EQ(c.status, 200) << c.body;
      const json usage = json::parse(c.body)["usage"];
      ASSERT_TRUE(usage.contains("tessera_kv_transfer")) << c.body << front.Log();
      const json transfer = usage["tessera_kv_transfer"];
      EXPECT_LE(transfer["streamed_bytes"].get<int64_t>(), transfer["bytes"].get<int64_t>());
      streamed += transfer["streamed_bytes"].get<int64_t>();
      bytes += transfer["bytes"].get<int64_t>();
      if (run.dtype == "f16") {
        EXPECT_EQ(c.text, alone[i].text) << name << " " << i;
        EXPECT_EQ(c.token_logprobs, alone[i].token_logprobs) << name << " " << i;
      }
    }
    std::fprintf(stderr, "%s: %lld of %lld bytes streamed before the prefills ended\n",
                 name.c_str(), static_cast<long long>(streamed), static_cast<long long>(bytes));
    EXPECT_GT(streamed, 0) << name << ": nothing arrived while the prefills ran";
    EXPECT_EQ(MetricValue(Metrics(front), "tessera_pd_kv_streamed_bytes_total{replica=\"1\"}"),
              streamed)
        << name;
    EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
  }
  fs::remove(model);
}

// Instances of several tensor-parallel ranks, and of different layouts: the
// blocks travel as a whole-model cache lays them out (gathered from the prefill
// instance's ranks, scattered over the decode instance's), so a tp=2 prefill
// instance feeding a tp=1 decode instance — in 32-token chunks, each gathered as
// it ends — and a tp=1 prefill instance feeding a tp=2 decode instance give one
// server's output bit for bit, with the planner's bytes; and a tp=2 pair sending
// q8_0 sends the same bytes as a tp=1 pair (the decode output equals that pair's).
TEST_F(PdProcessTest, TensorParallelInstancesOfDifferentLayoutsAreBitIdentical) {
  constexpr int kRequests = 4, kTokens = 12;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  auto run = [&](std::vector<std::string> flags, int expect_children) {
    std::vector<Completion> out;
    ServerProcess server;
    flags.insert(flags.begin(), {"-t", "1"});
    EXPECT_TRUE(server.Start(flags)) << server.Log();
    if (expect_children > 0) EXPECT_EQ(ChildrenOf(server.pid()).size(), size_t(expect_children));
    for (const std::string& p : prompts) out.push_back(Complete(server, Request(p, kTokens)));
    EXPECT_EQ(server.Stop(std::chrono::seconds(15)), 0) << server.Log();
    return out;
  };
  const std::vector<Completion> alone = run({}, 0);
  const std::vector<std::vector<std::string>> layouts = {
      {"--pd", "1:1", "--prefill-tp", "2", "--max-num-batched-tokens", "32", "--max-num-seqs", "8"},
      {"--pd", "1:1", "--decode-tp", "2"}};
  for (const std::vector<std::string>& flags : layouts) {
    const std::string name = flags[2] + " 2";
    const std::vector<Completion> pd = run(flags, 2);
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_EQ(pd[i].status, 200) << name << ": " << pd[i].body;
      EXPECT_EQ(pd[i].text, alone[i].text) << name << " " << i;
      EXPECT_EQ(pd[i].token_logprobs, alone[i].token_logprobs) << name << " " << i;
      const json usage = json::parse(pd[i].body)["usage"];
      const int64_t full = (usage["prompt_tokens"].get<int64_t>() - 1) / 16 * 16;
      ASSERT_TRUE(usage.contains("tessera_kv_transfer")) << name << ": " << pd[i].body;
      EXPECT_EQ(usage["tessera_kv_transfer"]["bytes"], PlannedBytes(full)) << name << " " << i;
    }
  }
  const std::vector<Completion> q8_one = run({"--pd", "1:1", "--kv-transfer-dtype", "q8_0"}, 2);
  const std::vector<Completion> q8_tp =
      run({"--pd", "1:1", "--tp", "2", "--kv-transfer-dtype", "q8_0"}, 2);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(q8_tp[i].status, 200) << q8_tp[i].body;
    EXPECT_EQ(q8_tp[i].text, q8_one[i].text) << i;
    EXPECT_EQ(q8_tp[i].token_logprobs, q8_one[i].token_logprobs) << i;
    EXPECT_EQ(json::parse(q8_tp[i].body)["usage"]["tessera_kv_transfer"]["bytes"],
              json::parse(q8_one[i].body)["usage"]["tessera_kv_transfer"]["bytes"])
        << i;
  }
}

// A client that goes away while its prompt is being prefilled: the front drops its
// call to the decode instance, which notices (its keep-alive write fails), gives
// the transfer up and tells the prefill instance, which cancels the prefill — the
// prefill instance goes idle without exporting it, not after computing the whole
// prompt for nobody. The service then answers as before.
TEST_F(PdProcessTest, AClientGoneMidPrefillStopsThePrefill) {
  // A prompt whose prefill takes seconds (the 110M shape, 64-token chunks, ~3,500
  // tokens), far longer than noticing the client is gone (~1 s a hop).
  const std::string model =
      ::testing::TempDir() + "/pd-cancel-synth-" + std::to_string(::getpid()) + ".gguf";
  const std::string synth = std::string(TESSERA_CLI_PATH) +
                            " synth --dim 768 --layers 12 --heads 12 --ffn 2048 --type q8_0 "
                            "--ctx 8192 --vocab-from " +
                            ModelPath() + " -o " + model + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(synth.c_str()), 0) << synth;
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--pd", "1:1", "--max-num-batched-tokens", "64",
                           "--max-num-seqs", "8", "--kv-tokens", "16384"},
                          model));
  std::string prompt = "Once upon a time";
  for (int k = 0; k < 140; ++k) {
    prompt += " there was a little girl named Lily who liked to play in the park with her dog " +
              std::to_string(k) + ".";
  }
  {
    httplib::Client client = front.Client();
    client.set_read_timeout(1, 0);  // gone after a second
    httplib::Result res =
        client.Post("/v1/completions", Request(prompt, 4).dump(), "application/json");
    ASSERT_FALSE(res) << "the prefill ended within a second: " << res->body;
  }
  // Idle again, having computed some of the prompt (its steps), however quickly the
  // cancellation came.
  bool idle = false;
  for (int i = 0; i < 600 && !idle; ++i) {  // up to a minute
    const std::string metrics = Metrics(front);
    idle = MetricValue(metrics, "tessera_steps_total{replica=\"0\"}") > 0 &&
           MetricValue(metrics, "tessera_num_requests_running{replica=\"0\"}") == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(idle) << front.Log();
  EXPECT_EQ(MetricValue(Metrics(front), "tessera_pd_kv_exports_total{replica=\"0\"}"), 0)
      << "the prefill ran to its end for a client that was gone\n"
      << front.Log();
  const Completion after = Complete(front, Request("Once upon a time there was a dog", 4));
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
  fs::remove(model);
}

bool Transferred(const Completion& c) {
  return json::parse(c.body)["usage"].contains("tessera_kv_transfer");
}

// The process of `instance`'s rank 1 (its launcher's child with RANK=1), or -1.
pid_t WorkerRankOf(pid_t instance) {
  for (pid_t rank : ChildrenOf(instance)) {
    if (EnvOf(rank, "RANK") == "1") return rank;
  }
  return -1;
}

// Instances over tp ranks heal as any tp group does: a worker rank of the prefill
// instance, later one of the decode instance, killed (-9) between requests; each
// launcher restarts its ranks and every request still gets one server's output,
// its blocks gathered and scattered on the new ranks.
TEST_F(PdProcessTest, AKilledRankOfATensorParallelInstanceLosesNoRequest) {
  constexpr int kRequests = 10, kTokens = 12;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens);
  ASSERT_EQ(alone.size(), prompts.size());
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--pd", "1:1", "--tp", "2"}));
  const pid_t prefill = PrefillInstance(front.pid());
  pid_t decode = -1;
  for (pid_t child : ChildrenOf(front.pid())) decode = child == prefill ? decode : child;
  const pid_t prefill_worker = WorkerRankOf(prefill), decode_worker = WorkerRankOf(decode);
  ASSERT_GT(prefill_worker, 0) << front.Log();
  ASSERT_GT(decode_worker, 0) << front.Log();
  int transferred = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (i == 3) ASSERT_EQ(::kill(prefill_worker, SIGKILL), 0);
    if (i == 6) ASSERT_EQ(::kill(decode_worker, SIGKILL), 0);
    const Completion c = Complete(front, Request(prompts[i], kTokens));
    ASSERT_EQ(c.status, 200) << i << ": " << c.body << front.Log();
    EXPECT_EQ(c.text, alone[i].text) << i;
    EXPECT_EQ(c.token_logprobs, alone[i].token_logprobs) << i;
    transferred += Transferred(c) ? 1 : 0;
  }
  EXPECT_GE(transferred, kRequests - 2) << "most prompts' KV should still travel";
  const std::string log = front.Log();
  size_t restarts = 0;
  for (size_t at = log.find("the engine is back"); at != std::string::npos;
       at = log.find("the engine is back", at + 1)) {
    ++restarts;
  }
  EXPECT_GE(restarts, 2u) << log;  // one a killed rank
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << log;
}

TEST_F(PdProcessTest, DeadOrFrozenPrefillInstanceLosesNoRequest) {
  constexpr int kRequests = 12, kFrozen = 3, kTokens = 48;
  const std::vector<std::string> prompts = LongPrompts(kRequests + kFrozen + 1);
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens);
  ASSERT_EQ(alone.size(), prompts.size());
  ServerProcess front;
  ASSERT_TRUE(front.Start(
      {"-t", "1", "--pd", "1:1", "--http-threads", "32", "--kv-transfer-timeout-s", "1"}));
  const pid_t prefill = PrefillInstance(front.pid());
  ASSERT_GT(prefill, 0);

  // kill -9 of the prefill instance in the middle of a load: every request
  // completes with the single server's output.
  std::vector<Completion> pd(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] { pd[i] = Complete(front, Request(prompts[i], kTokens)); });
    if (i == kRequests / 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_EQ(::kill(prefill, SIGKILL), 0);
    }
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(pd[i].status, 200) << pd[i].body;
    EXPECT_EQ(pd[i].text, alone[i].text) << i;
    EXPECT_EQ(pd[i].token_logprobs, alone[i].token_logprobs) << i;
  }

  // The restarted instance, frozen (SIGSTOP): its transfers time out (1 s) and
  // the decode instance computes those prompts itself — same output, no
  // transfer in their usage.
  auto restarted = [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      const pid_t p = PrefillInstance(front.pid());
      if (p > 0 && p != prefill) return p;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pid_t{-1};
  };
  // Up (it answers /health through the front) and linked (a transfer happens).
  const pid_t second = restarted();
  ASSERT_GT(second, 0) << front.Log();
  bool linked = false;
  for (int attempt = 0; attempt < 100 && !linked; ++attempt) {
    const Completion c = Complete(
        front, Request("Probe " + std::to_string(attempt) + " " + prompts[kRequests + kFrozen], 2));
    ASSERT_EQ(c.status, 200) << c.body;
    linked = Transferred(c);
    if (!linked) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(linked) << front.Log();
  ASSERT_EQ(::kill(second, SIGSTOP), 0);
  std::vector<Completion> frozen(kFrozen);
  clients.clear();
  for (int i = 0; i < kFrozen; ++i) {
    clients.emplace_back(
        [&, i] { frozen[i] = Complete(front, Request(prompts[kRequests + i], kTokens)); });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kFrozen; ++i) {
    ASSERT_EQ(frozen[i].status, 200) << frozen[i].body;
    EXPECT_EQ(frozen[i].text, alone[kRequests + i].text) << i;
    EXPECT_EQ(frozen[i].token_logprobs, alone[kRequests + i].token_logprobs) << i;
    EXPECT_FALSE(Transferred(frozen[i])) << frozen[i].body;
  }

  // Killed while frozen: restarted, and transfers resume.
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  ASSERT_GT(restarted(), 0);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  bool transferred = false;
  for (int attempt = 0; !transferred && Clock::now() < deadline; ++attempt) {
    const Completion c = Complete(
        front, Request("Again " + std::to_string(attempt) + " " + prompts[kRequests + kFrozen], 2));
    ASSERT_EQ(c.status, 200) << c.body;
    transferred = Transferred(c);
    if (!transferred) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(transferred) << front.Log();
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
}

TEST_F(PdProcessTest, KilledDecodeInstanceLosesNoRequest) {
  constexpr int kRequests = 12, kTokens = 200;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  const std::vector<Completion> alone = AloneAnswers(prompts, kTokens);
  ASSERT_EQ(alone.size(), prompts.size());
  ServerProcess front;
  ASSERT_TRUE(front.Start({"-t", "1", "--pd", "1:2", "--http-threads", "32"}));
  pid_t decode = -1;
  for (pid_t child : ChildrenOf(front.pid())) {
    if (ReadFile("/proc/" + std::to_string(child) + "/environ").find("TESSERA_PD_ROLE=decode:0") !=
        std::string::npos) {
      decode = child;
    }
  }
  ASSERT_GT(decode, 0);
  std::vector<Completion> pd(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] { pd[i] = Complete(front, Request(prompts[i], kTokens)); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(::kill(decode, SIGKILL), 0);
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(pd[i].status, 200) << pd[i].body;
    EXPECT_EQ(pd[i].text, alone[i].text) << i;
    EXPECT_EQ(pd[i].token_logprobs, alone[i].token_logprobs) << i;
  }
  const std::string metrics = Metrics(front);
  EXPECT_GE(MetricValue(metrics, "tessera_dp_reruns_total"), 1) << metrics;
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
}

}  // namespace
}  // namespace tessera::serve
