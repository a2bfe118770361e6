// `tessera serve --pd 1:1` as real processes on loopback (the front, one prefill
// and one decode instance, on ../shared/models/stories260K.gguf): every request's
// prompt is computed on the prefill instance and its KV blocks sent to the
// decode instance, whose output — text and every logprob — is bit-identical to a
// plain single-process serve of the same requests; each request's transferred
// bytes equal the planner's KvTransferBytes for the tokens sent; kill -9 of the
// prefill instance under load loses no request (the decode instance computes
// the prompts whose transfer failed) and, once restarted, it prefills again.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

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

// The planner's bytes for `tokens` tokens of stories260K's f16 KV cache.
int64_t PlannedBytes(int64_t tokens) {
  Result<model::GgufFile> file = model::GgufFile::Open(ModelPath());
  EXPECT_TRUE(file.ok());
  Result<model::ModelConfig> config = model::ModelConfigFromGguf(*file);
  EXPECT_TRUE(config.ok());
  plan::ModelShape shape;
  shape.num_layers = config->num_layers;
  shape.num_kv_heads = config->num_kv_heads;
  shape.head_dim = config->head_dim;
  Result<plan::DType> f16 = plan::ParseDType("f16");
  EXPECT_TRUE(f16.ok());
  return plan::KvTransferBytes(shape, *f16, tokens);
}

pid_t PrefillInstance(pid_t front) {
  for (pid_t child : ChildrenOf(front)) {
    if (ReadFile("/proc/" + std::to_string(child) + "/environ").find("TESSERA_PD_ROLE=prefill") !=
        std::string::npos) {
      return child;
    }
  }
  return -1;
}

TEST_F(PdProcessTest, DecodeOutputIsBitIdenticalToOneServerAndBytesArePlanned) {
  constexpr int kRequests = 8, kTokens = 24;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  std::vector<Completion> alone;
  {
    ServerProcess single;
    ASSERT_TRUE(single.Start({"-t", "1"}));
    for (const std::string& p : prompts) alone.push_back(Complete(single, Request(p, kTokens)));
    EXPECT_EQ(single.Stop(std::chrono::seconds(10)), 0) << single.Log();
  }
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
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
}

TEST_F(PdProcessTest, KilledPrefillInstanceLosesNoRequestAndComesBack) {
  constexpr int kRequests = 12, kTokens = 48;
  const std::vector<std::string> prompts = LongPrompts(kRequests);
  std::vector<Completion> alone;
  {
    ServerProcess single;
    ASSERT_TRUE(single.Start({"-t", "1"}));
    for (const std::string& p : prompts) alone.push_back(Complete(single, Request(p, kTokens)));
    EXPECT_EQ(single.Stop(std::chrono::seconds(10)), 0) << single.Log();
  }
  ServerProcess front;
  ASSERT_TRUE(front.Start(
      {"-t", "1", "--pd", "1:1", "--http-threads", "32", "--kv-transfer-timeout-s", "5"}));
  const pid_t prefill = PrefillInstance(front.pid());
  ASSERT_GT(prefill, 0);
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
  // The restarted prefill instance serves transfers again.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  bool transferred = false;
  while (!transferred && Clock::now() < deadline) {
    const Completion c = Complete(
        front, Request("A new story " + std::to_string(Clock::now().time_since_epoch().count()) +
                           prompts[4],
                       4));
    ASSERT_EQ(c.status, 200) << c.body;
    transferred = json::parse(c.body)["usage"].contains("tessera_kv_transfer");
    if (!transferred) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(transferred) << front.Log();
  EXPECT_NE(PrefillInstance(front.pid()), prefill);
  EXPECT_EQ(front.Stop(std::chrono::seconds(15)), 0) << front.Log();
}

}  // namespace
}  // namespace tessera::serve
