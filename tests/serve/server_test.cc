// The HTTP server end to end, in-process on an ephemeral port, over a real
// scheduler and the one-rank Driver on stories260K: completions (JSON and SSE),
// chat (refused without a template; rendered with an injected chatml one), auth,
// bad requests, 429 on a full queue, /metrics, and cancellation when a streaming
// client disconnects. A SlowExecutor stretches steps so the queue and
// disconnect cases are not races against a model that finishes in milliseconds.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/thread_pool.h"
#include "engine/driver.h"
#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/shard.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metered_executor.h"
#include "serve/metrics.h"
#include "serve/openai_server.h"

namespace tessera::serve {
namespace {

using nlohmann::json;

const char kKey[] = "test-key";
constexpr int64_t kMaxModelLen = 512;
constexpr size_t kMaxBody = 64 << 10;

// Forwards to another executor, sleeping delay_ms before each step's result.
class SlowExecutor final : public engine::StepExecutor {
 public:
  explicit SlowExecutor(engine::StepExecutor& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  int max_in_flight() const override { return inner_.max_in_flight(); }
  Status Submit(std::span<const engine::StepEntry> entries, bool all_logits) override {
    return inner_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override {
    if (int ms = delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return inner_.Collect();
  }
  std::atomic<int> delay_ms{0};

 private:
  engine::StepExecutor& inner_;
};

struct Stack {
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<engine::StageRunner> runner;
  std::unique_ptr<engine::Driver> driver;
  std::unique_ptr<model::Tokenizer> tokenizer;
  Metrics metrics;
  std::unique_ptr<MeteredExecutor> metered;
  std::unique_ptr<SlowExecutor> slow;
  std::unique_ptr<engine::Scheduler> scheduler;
  std::unique_ptr<ChatTemplate> chatml;
  std::unique_ptr<OpenAiServer> plain, chat;  // no chat template; chatml injected
  int plain_port = 0, chat_port = 0;
  std::thread scheduler_thread, plain_thread, chat_thread;
};

Stack* stack = nullptr;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);
    const std::string path = std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf";
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    stack = new Stack;
    Stack& s = *stack;
    s.file = std::make_unique<model::GgufFile>(std::move(model::GgufFile::Open(path).value()));
    model::ModelConfig config = model::ModelConfigFromGguf(*s.file).value();
    parallel::Partition plan =
        model::PartitionForModel(*s.file, config, {.tp = 1, .pp = 1}).value();
    s.pool = std::make_unique<ThreadPool>(1);
    engine::RuntimeOptions options;
    options.kv_capacity_tokens = 4 * kMaxModelLen;
    options.max_step_tokens = 256;
    options.max_step_sequences = 8;
    s.runner =
        std::move(engine::StageRunner::Create(plan, 0, {}, *s.file, *s.pool, options).value());
    s.driver = std::make_unique<engine::Driver>(*s.runner);
    s.tokenizer =
        std::make_unique<model::Tokenizer>(std::move(model::Tokenizer::FromGguf(*s.file).value()));
    s.metered = std::make_unique<MeteredExecutor>(*s.driver, s.runner->groups(), s.metrics);
    s.metered->SetReportSource(s.driver.get(), /*poll_interval_ns=*/0);  // after every step
    s.slow = std::make_unique<SlowExecutor>(*s.metered);
    engine::SchedulerOptions sched;
    sched.max_num_seqs = 2;
    sched.max_waiting = 1;
    sched.max_num_batched_tokens = 256;
    sched.max_model_len = kMaxModelLen;
    // Speculative decoding available, off unless a request asks ("spec_tokens").
    sched.proposer = std::make_shared<engine::NgramProposer>();
    sched.spec_tokens = 0;
    ASSERT_TRUE(engine::ValidateSchedulerOptions(sched, *s.slow).ok());
    s.scheduler = std::make_unique<engine::Scheduler>(*s.slow, *s.tokenizer, sched);
    s.scheduler_thread = std::thread([&s] { EXPECT_TRUE(s.scheduler->Run().ok()); });

    ServerOptions server;
    server.port = 0;
    server.api_key = kKey;
    server.model_name = "stories260K";
    server.max_body_bytes = kMaxBody;
    server.http_threads = 16;
    s.plain = std::make_unique<OpenAiServer>(
        *s.scheduler, *s.tokenizer, nullptr,
        "this model has no chat template (tokenizer.chat_template)", s.metrics, server);
    s.plain_port = s.plain->Bind().value();
    s.chatml = std::make_unique<ChatTemplate>(ChatFamily::kChatMl, "<s>", "</s>");
    s.chat = std::make_unique<OpenAiServer>(*s.scheduler, *s.tokenizer, s.chatml.get(), "",
                                            s.metrics, server);
    s.chat_port = s.chat->Bind().value();
    s.plain_thread = std::thread([&s] { EXPECT_TRUE(s.plain->Serve().ok()); });
    s.chat_thread = std::thread([&s] { EXPECT_TRUE(s.chat->Serve().ok()); });
  }

  static void TearDownTestSuite() {
    if (!stack) return;
    Stack& s = *stack;
    s.scheduler->Stop(/*cancel_in_flight=*/true);
    s.plain->Stop();
    s.chat->Stop();
    s.plain_thread.join();
    s.chat_thread.join();
    s.scheduler_thread.join();
    EXPECT_TRUE(s.driver->Shutdown().ok());
    s.plain.reset();
    s.chat.reset();
    s.scheduler.reset();
    delete stack;
    stack = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(stack, nullptr);
    stack->slow->delay_ms = 0;
  }

  static httplib::Client Client(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(30, 0);
    client.set_bearer_token_auth(kKey);
    return client;
  }

  static httplib::Result Post(const std::string& path, const std::string& body, int port = 0) {
    httplib::Client client = Client(port ? port : stack->plain_port);
    return client.Post(path.c_str(), body, "application/json");
  }

  // The SSE body of a streaming POST, split into its "data: " payloads.
  static std::vector<std::string> PostStream(const std::string& path, const std::string& body,
                                             int port = 0, int* status = nullptr) {
    httplib::Result res = Post(path, body, port);
    EXPECT_TRUE(res) << "no response";
    if (!res) return {};
    if (status) *status = res->status;
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
    std::vector<std::string> data;
    size_t pos = 0;
    const std::string& text = res->body;
    while (pos < text.size()) {
      size_t end = text.find("\n\n", pos);
      if (end == std::string::npos) end = text.size();
      std::string event = text.substr(pos, end - pos);
      if (event.rfind("data: ", 0) == 0) data.push_back(event.substr(6));
      pos = end + 2;
    }
    return data;
  }

  static json ErrorOf(const httplib::Result& res) {
    EXPECT_TRUE(res);
    if (!res) return {};
    json body = json::parse(res->body, nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("error")) << res->body;
    if (!body.is_object() || !body.contains("error")) return {};
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param") &&
                body["error"].contains("code"));
    return body["error"];
  }

  static std::string Metrics() {
    httplib::Client client = Client(stack->plain_port);
    httplib::Result res = client.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    return res ? res->body : "";
  }

  // Completions finished as "cancelled" so far (from /metrics).
  static int64_t CancelledCompletions();
  // Posts `body` to /v1/completions, hangs up when `receive` returns false, and
  // expects the server to cancel the request within `within` of the send.
  static void ExpectHangUpCancels(const std::string& body,
                                  const httplib::ContentReceiverWithProgress& receive,
                                  std::chrono::seconds within);
};

const char kGreedy[] = R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":12,)"
                       R"("temperature":0)";

TEST_F(ServerTest, CompletionJson) {
  httplib::Result res = Post("/v1/completions", std::string(kGreedy) + "}");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "stories260K");
  ASSERT_EQ(body["choices"].size(), 1u);
  const std::string text = body["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  const std::string reason = body["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
  const json& usage = body["usage"];
  EXPECT_GT(usage["prompt_tokens"].get<int64_t>(), 0);
  EXPECT_GT(usage["completion_tokens"].get<int64_t>(), 0);
  EXPECT_LE(usage["completion_tokens"].get<int64_t>(), 12);
  EXPECT_EQ(usage["total_tokens"].get<int64_t>(),
            usage["prompt_tokens"].get<int64_t>() + usage["completion_tokens"].get<int64_t>());
  EXPECT_FALSE(usage.contains("tessera_timing"));
  // Greedy is reproducible; "return_timing" adds where the request's time went.
  httplib::Result again =
      Post("/v1/completions", std::string(kGreedy) + R"(,"return_timing":true})");
  ASSERT_TRUE(again);
  const json second = json::parse(again->body);
  EXPECT_EQ(second["choices"][0]["text"], text);
  const json& timing = second["usage"]["tessera_timing"];
  ASSERT_TRUE(timing.is_object()) << again->body;
  for (const char* field : {"queue_ms", "prefill_ms", "decode_ms", "comm_ms"}) {
    ASSERT_TRUE(timing.contains(field)) << field;
    EXPECT_GE(timing[field].get<double>(), 0) << field;
  }
  EXPECT_GT(timing["decode_ms"].get<double>() + timing["prefill_ms"].get<double>(), 0);
}

TEST_F(ServerTest, CompletionLogprobs) {
  httplib::Result res =
      Post("/v1/completions", std::string(kGreedy) + R"(,"logprobs":3,"ignore_eos":true})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json lp = json::parse(res->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 12u);
  ASSERT_EQ(lp["token_logprobs"].size(), 12u);
  ASSERT_EQ(lp["top_logprobs"].size(), 12u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
  EXPECT_GE(lp["top_logprobs"][0].size(), 1u);
  EXPECT_LE(lp["top_logprobs"][0].size(), 3u);
}

TEST_F(ServerTest, CompletionStreamEndsWithDoneAndUsage) {
  const std::string whole =
      json::parse(Post("/v1/completions", std::string(kGreedy) + "}")->body)["choices"][0]["text"];
  int status = 0;
  std::vector<std::string> data = PostStream(
      "/v1/completions",
      std::string(kGreedy) + R"(,"stream":true,"stream_options":{"include_usage":true}})", 0,
      &status);
  EXPECT_EQ(status, 200);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    json chunk = json::parse(data[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    if (chunk.contains("usage")) {
      usage = chunk["usage"];
      EXPECT_TRUE(chunk["choices"].empty());
      continue;
    }
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null())
      finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, whole);
  EXPECT_FALSE(finish.empty());
  ASSERT_TRUE(usage.is_object());
  EXPECT_GT(usage["completion_tokens"].get<int64_t>(), 0);
}

TEST_F(ServerTest, ChatWithoutTemplateIsRefused) {
  httplib::Result res = Post("/v1/chat/completions",
                             R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  json error = ErrorOf(res);
  EXPECT_NE(error["message"].get<std::string>().find("chat template"), std::string::npos);
}

TEST_F(ServerTest, ChatWithInjectedTemplate) {
  const std::string body = R"({"messages":[{"role":"system","content":"Tell a story."},)"
                           R"({"role":"user","content":"Once"}],"max_tokens":6,"temperature":0)";
  httplib::Result res = Post("/v1/chat/completions", body + "}", stack->chat_port);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int64_t>(), 5);

  std::vector<std::string> data =
      PostStream("/v1/chat/completions", body + R"(,"stream":true})", stack->chat_port);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(data.back(), "[DONE]");
  json first = json::parse(data[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    json delta = json::parse(data[i])["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(ServerTest, AuthIsRequiredOnV1) {
  httplib::Client anonymous("127.0.0.1", stack->plain_port);
  httplib::Result res =
      anonymous.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(ErrorOf(res)["code"], "invalid_api_key");
  httplib::Client wrong("127.0.0.1", stack->plain_port);
  wrong.set_bearer_token_auth("nope");
  res = wrong.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  res = anonymous.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  httplib::Client ok = Client(stack->plain_port);
  res = ok.Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["data"][0]["id"], "stories260K");
}

TEST_F(ServerTest, BadRequests) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x",)", 400, ""},
      {R"({"prompt":"x","max_tokens":"3"})", 400, "max_tokens"},
      {R"({"prompt":"x","max_tokens":-1})", 400, "max_tokens"},
      {R"({"prompt":"x","max_tokens":100000000})", 400, "max_tokens"},
      {R"({"prompt":"x","n":2})", 400, "n"},
      {R"({"prompt":"x","temperature":"warm"})", 400, "temperature"},
      {R"({"prompt":"x","model":"gpt-4"})", 404, "model"},
      {"{\"prompt\":\"\xff\"}", 400, ""},
      {R"({"prompt":"x","max_tokens":510})", 400, "max_tokens"},  // prompt + 510 > 512
  };
  for (const Case& c : cases) {
    httplib::Result res = Post("/v1/completions", c.body);
    ASSERT_TRUE(res) << c.body;
    EXPECT_EQ(res->status, c.status) << c.body << " → " << res->body;
    json error = ErrorOf(res);
    if (!c.param.empty()) {
      EXPECT_EQ(error["param"], c.param) << c.body;
    }
  }
  // A prompt longer than the context.
  json long_prompt = {{"prompt", std::vector<int>(600, 100)}, {"max_tokens", 1}};
  httplib::Result res = Post("/v1/completions", long_prompt.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(ErrorOf(res)["code"], "context_length_exceeded");
  // A body over the limit: httplib refuses it before the handler, still as JSON.
  res = Post("/v1/completions", R"({"prompt":")" + std::string(kMaxBody + 10, 'a') + "\"}");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  ErrorOf(res);
  // The server still serves.
  res = Post("/v1/completions", std::string(kGreedy) + "}");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

// The context limit is the scheduler's alone: /v1/models reports it, a request
// that does not fit is refused naming the field at fault, and the default
// max_tokens fills what is left of it.
TEST_F(ServerTest, ContextLimitIsTheSchedulers) {
  ASSERT_EQ(stack->scheduler->max_model_len(), kMaxModelLen);
  httplib::Client client = Client(stack->plain_port);
  httplib::Result res = client.Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["data"][0]["max_model_len"], kMaxModelLen);

  auto token_prompt = [](int64_t num_tokens, int64_t max_tokens) {
    json body = {
        {"prompt", std::vector<int>(num_tokens, 100)}, {"temperature", 0}, {"ignore_eos", true}};
    if (max_tokens > 0) body["max_tokens"] = max_tokens;
    return body.dump();
  };
  auto expect_refused = [](const httplib::Result& res, const std::string& param,
                           const std::string& code) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    json error = ErrorOf(res);
    EXPECT_EQ(error["param"], param) << res->body;
    EXPECT_EQ(error["code"], code.empty() ? json(nullptr) : json(code)) << res->body;
  };
  // A prompt that fills the context leaves no room, whether max_tokens is given or not.
  expect_refused(Post("/v1/completions", token_prompt(kMaxModelLen, 1)), "prompt",
                 "context_length_exceeded");
  expect_refused(Post("/v1/completions", token_prompt(kMaxModelLen, 0)), "prompt",
                 "context_length_exceeded");
  // prompt + max_tokens one past the context; then exactly at it.
  expect_refused(Post("/v1/completions", token_prompt(500, 13)), "max_tokens",
                 "context_length_exceeded");
  res = Post("/v1/completions", token_prompt(500, 12));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 12);
  // Without max_tokens a completion gets 16 tokens, or the room left.
  res = Post("/v1/completions", token_prompt(kMaxModelLen - 2, 0));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 2);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  // A token id outside the vocabulary.
  const int64_t vocab = stack->tokenizer->vocab_size();
  expect_refused(Post("/v1/completions", json{{"prompt", json::array({1, vocab})}}.dump()),
                 "prompt", "");

  // Chat: a conversation past the context is the messages' fault ...
  std::string long_text;
  for (int i = 0; i < 1000; ++i) long_text += "hello ";
  json chat = {{"messages", json::array({json{{"role", "user"}, {"content", long_text}}})}};
  expect_refused(Post("/v1/chat/completions", chat.dump(), stack->chat_port), "messages",
                 "context_length_exceeded");
  // ... and without max_tokens a reply may run until the context is full.
  chat = {{"messages", json::array({json{{"role", "user"}, {"content", "Hi"}}})},
          {"temperature", 0},
          {"ignore_eos", true}};
  res = Post("/v1/chat/completions", chat.dump(), stack->chat_port);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  body = json::parse(res->body);
  EXPECT_EQ(body["usage"]["total_tokens"], kMaxModelLen);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, FullQueueGets429) {
  stack->slow->delay_ms = 20;
  // Two running (max_num_seqs 2) and one waiting (max_waiting 1) fill the scheduler.
  const std::string body =
      R"({"prompt":"Once","max_tokens":80,"ignore_eos":true,"temperature":0,"stream":true})";
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  std::atomic<int> streaming{0};  // clients that received their first chunk (running)
  // One at a time: Submit counts requests not yet taken by the scheduler thread
  // as waiting too. A and B run (their streams start); C waits.
  auto start = [&] {
    clients.emplace_back([&] {
      httplib::Client client = Client(stack->plain_port);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.set_header("Content-Type", "application/json");
      req.set_header("Authorization", std::string("Bearer ") + kKey);
      req.body = body;
      bool first = true;
      req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
        if (first) ++streaming;
        first = false;
        return true;
      };
      httplib::Result res = client.send(req);
      if (res && res->status == 200) ++ok;
    });
  };
  auto wait_for = [](auto done) {
    for (int i = 0; i < 400 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  start();
  bool full = wait_for([&] { return streaming.load() >= 1; });
  start();
  full = full && wait_for([&] { return streaming.load() >= 2; });
  start();
  full = full && wait_for([&] { return stack->scheduler->Stats().waiting >= 1; });
  if (!full) {
    for (std::thread& t : clients) t.join();
    FAIL() << "the scheduler never had 2 running + 1 waiting (" << streaming.load()
           << " streaming, " << ok.load() << " done)";
  }
  httplib::Result res = Post("/v1/completions", body);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(ErrorOf(res)["type"], "rate_limit_error");
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 3);
}

int64_t ServerTest::CancelledCompletions() {
  const std::string m = Metrics();
  const std::string key =
      "tessera_requests_total{endpoint=\"completions\",finish_reason=\"cancelled\"} ";
  const size_t pos = m.find(key);
  return pos == std::string::npos ? 0 : std::stoll(m.substr(pos + key.size()));
}

void ServerTest::ExpectHangUpCancels(const std::string& body,
                                     const httplib::ContentReceiverWithProgress& receive,
                                     std::chrono::seconds within) {
  const int64_t before = CancelledCompletions();
  httplib::Client client = Client(stack->plain_port);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("Authorization", std::string("Bearer ") + kKey);
  req.body = body;
  req.content_receiver = receive;
  const auto start = std::chrono::steady_clock::now();
  httplib::Result res = client.send(req);
  EXPECT_FALSE(res);  // the client cancelled
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() - start < within) {
    seen = CancelledCompletions() > before;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(seen) << "the request was not cancelled after the client hung up";
  EXPECT_LT(std::chrono::steady_clock::now() - start, within);
}

TEST_F(ServerTest, DisconnectCancelsTheRequest) {
  stack->slow->delay_ms = 20;
  int chunks = 0;
  // 300 tokens at 20 ms would take 6 s; the cancellation comes well before 5 s.
  ExpectHangUpCancels(R"({"prompt":"Once","max_tokens":300,"ignore_eos":true,"stream":true})",
                      [&](const char*, size_t, uint64_t, uint64_t) {
                        return ++chunks < 2;  // hang up after the second chunk
                      },
                      std::chrono::seconds(5));
}

// A non-streaming client that hangs up is found too: a request that takes longer
// than a second is answered 200 at once and kept alive with JSON whitespace, whose
// writes fail once the client is gone.
TEST_F(ServerTest, NonStreamingDisconnectCancelsTheRequest) {
  stack->slow->delay_ms = 25;
  std::string received;
  // 500 tokens at 25 ms would take 12.5 s; the cancellation comes well before 10 s.
  ExpectHangUpCancels(R"({"prompt":"Once","max_tokens":500,"ignore_eos":true})",
                      [&](const char* data, size_t size, uint64_t, uint64_t) {
                        received.append(data, size);
                        return false;  // hang up at the first keep-alive byte
                      },
                      std::chrono::seconds(10));
  EXPECT_EQ(received, " ");
}

// A long non-streaming request still gets one well-formed JSON body (after the
// keep-alive spaces).
TEST_F(ServerTest, LongNonStreamingRequestGetsItsBody) {
  stack->slow->delay_ms = 20;
  auto res = Post("/v1/completions", R"({"prompt":"Once","max_tokens":100,"ignore_eos":true})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->body.front(), ' ') << "expected keep-alive whitespace before the JSON";
  const auto body = nlohmann::json::parse(res->body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 100);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, MetricsExposition) {
  ASSERT_EQ(Post("/v1/completions", std::string(kGreedy) + "}")->status, 200);
  httplib::Client anonymous("127.0.0.1", stack->plain_port);
  ASSERT_EQ(anonymous.Get("/v1/models")->status, 401);
  // httplib's logger counts an error after the response went out: the 401 may
  // reach the counter a moment after the client has it.
  std::string m = Metrics();
  for (int i = 0;
       i < 200 && m.find("tessera_http_errors_total{status=\"401\"}") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = Metrics();
  }
  for (const char* series :
       {"# TYPE tessera_num_requests_running gauge", "tessera_num_requests_waiting ",
        "tessera_kv_cache_usage_ratio ", "tessera_prompt_tokens_total ",
        "tessera_generation_tokens_total ", "tessera_time_to_first_token_seconds_bucket{le=",
        "tessera_time_per_output_token_seconds_count ", "tessera_e2e_request_latency_seconds_sum ",
        "tessera_requests_total{endpoint=\"completions\",finish_reason=",
        "tessera_http_errors_total{status=\"401\"}", "tessera_comm_seconds_total ",
        "tessera_request_queue_seconds_count ", "tessera_request_prefill_seconds_bucket{le=",
        "tessera_request_decode_seconds_sum ", "tessera_request_comm_seconds_total "}) {
    EXPECT_NE(m.find(series), std::string::npos) << series << "\n" << m;
  }
  const size_t pos = m.find("\ntessera_generation_tokens_total ");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GT(std::stoll(m.substr(pos + 33)), 0);
}

// The same long prompt twice: the second reuses the first one's full KV blocks,
// says so in usage.prompt_tokens_details.cached_tokens, gets the same text, and
// /metrics counts the hit.
TEST_F(ServerTest, RepeatedPromptIsServedFromThePrefixCache) {
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "Once upon a time there was a little dog. ";
  const std::string body =
      R"({"model":"stories260K","prompt":")" + prompt + R"(","max_tokens":6,"temperature":0})";
  httplib::Result first = Post("/v1/completions", body);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  httplib::Result second = Post("/v1/completions", body);
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  const json a = json::parse(first->body), b = json::parse(second->body);
  const int64_t prompt_tokens = b["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_GT(prompt_tokens, 32);
  const int64_t cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_EQ(cached, (prompt_tokens - 1) / 16 * 16);  // every full block but the last token's
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  const std::string m = Metrics();
  for (const char* series :
       {"tessera_prefix_cache_enabled 1", "tessera_prefix_cache_queries_total ",
        "tessera_prefix_cache_query_tokens_total ", "tessera_prefix_cache_hit_tokens_total ",
        "tessera_prefix_cache_hit_blocks_total ", "tessera_prefix_cache_hit_rate ",
        "tessera_prefix_cache_evictions_total ", "tessera_prefix_cache_waits_total ",
        "tessera_kv_cache_blocks_cached ", "tessera_kv_cache_blocks_evictable "}) {
    EXPECT_NE(m.find(series), std::string::npos) << series << "\n" << m;
  }
  const size_t pos = m.find("\ntessera_prefix_cache_hit_tokens_total ");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GE(std::stoll(m.substr(pos + 39)), cached);
}

// A request that opts in to speculative decoding gets the same greedy text;
// /metrics counts its guesses; a value out of range is refused by name.
TEST_F(ServerTest, SpecTokensOptInKeepsTheTextAndShowsInMetrics) {
  const std::string body =
      R"({"model":"stories260K","prompt":"Tom had a red ball. He liked the ball. Tom had a red )"
      R"(ball. He liked the","max_tokens":40,"temperature":0)";
  httplib::Result plain = Post("/v1/completions", body + "}");
  httplib::Result spec = Post("/v1/completions", body + R"(,"spec_tokens":4})");
  ASSERT_TRUE(plain && spec);
  ASSERT_EQ(plain->status, 200) << plain->body;
  ASSERT_EQ(spec->status, 200) << spec->body;
  EXPECT_EQ(json::parse(plain->body)["choices"][0]["text"],
            json::parse(spec->body)["choices"][0]["text"]);
  const std::string m = Metrics();
  for (const char* series :
       {"tessera_spec_decode_enabled 1", "tessera_spec_decode_acceptance_rate ",
        "tessera_spec_decode_mean_accepted_length ", "tessera_spec_decode_verifications_total ",
        "tessera_spec_decode_accepted_tokens_total "}) {
    EXPECT_NE(m.find(series), std::string::npos) << series << "\n" << m;
  }
  const size_t pos = m.find("\ntessera_spec_decode_proposed_tokens_total ");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GT(std::stoll(m.substr(pos + 43)), 0);
  EXPECT_EQ(ErrorOf(Post("/v1/completions", body + R"(,"spec_tokens":99})"))["param"],
            "spec_tokens");
}

}  // namespace
}  // namespace tessera::serve

namespace tessera::serve {
namespace {

// The live view: the page, every file it links is served with its type, and
// /ui/state is JSON whose numbers follow the requests served; a server built with
// ui = false answers 404 there and still serves the API.
TEST_F(ServerTest, LiveViewPageAndStateAreServed) {
  httplib::Client client("127.0.0.1", stack->plain_port);  // no key: the view is open
  httplib::Result page = client.Get("/");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page->body.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(page->body.find("</html>"), std::string::npos);
  // Every local file the page links (src="/…", href="/…") is served; nothing external.
  int linked = 0;
  for (const std::string attr : {"src=\"", "href=\""}) {
    for (size_t pos = page->body.find(attr); pos != std::string::npos;
         pos = page->body.find(attr, pos + 1)) {
      const size_t begin = pos + attr.size();
      const std::string url = page->body.substr(begin, page->body.find('"', begin) - begin);
      ASSERT_EQ(url.rfind("/ui/", 0), 0u) << url;
      httplib::Result res = client.Get(url);
      ASSERT_TRUE(res) << url;
      EXPECT_EQ(res->status, 200) << url;
      EXPECT_NE(
          res->get_header_value("Content-Type").find(url.ends_with(".js") ? "javascript" : "css"),
          std::string::npos)
          << url;
      ++linked;
    }
  }
  EXPECT_EQ(linked, 2);

  auto state = [&client] {
    httplib::Result res = client.Get("/ui/state");
    EXPECT_TRUE(res && res->status == 200);
    if (!res) return json();
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
    json parsed = json::parse(res->body, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << res->body;
    return parsed;
  };
  const json before = state();
  ASSERT_TRUE(before.is_object());
  EXPECT_EQ(before["model"], "stories260K");
  EXPECT_EQ(before["max_model_len"], kMaxModelLen);
  EXPECT_EQ(before["latency"]["buckets"].size(), 30u);
  const httplib::Result done =
      Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":8,)"
                              R"("temperature":0,"ignore_eos":true})");
  ASSERT_TRUE(done && done->status == 200);
  const json after = state();
  ASSERT_TRUE(after.is_object());
  // 8 tokens: a prefill and 7 decodes; the scheduler publishes its counters after
  // the step whose tokens answered, so the last step may not be counted yet.
  EXPECT_GE(after["scheduler"]["steps_total"].get<int64_t>(),
            before["scheduler"]["steps_total"].get<int64_t>() + 7);
  EXPECT_GE(after["latency"]["last_minute"]["requests"].get<int64_t>(),
            before["latency"]["last_minute"]["requests"].get<int64_t>() + 1);
  EXPECT_GT(after["latency"]["last_minute"]["ttft_p50_s"].get<double>(), 0);
  EXPECT_GT(after["latency"]["buckets"].back()["requests"].get<int64_t>(), 0);
  ASSERT_EQ(after["ranks"].size(), 1u) << after;
  const json& rank = after["ranks"][0];
  EXPECT_GE(rank["total"]["steps"].get<int64_t>(), 7);
  EXPECT_GT(rank["total"]["compute_s"].get<double>(), 0);
  EXPECT_EQ(rank["total"]["comm_s"].get<double>(), 0);  // one rank
  ASSERT_TRUE(rank["interval"].is_object()) << rank;    // polled after every step
  EXPECT_EQ(after["groups"].size(), 0u);
  EXPECT_EQ(after["ledger"].size(), 0u);

  ServerOptions options;
  options.port = 0;
  options.model_name = "stories260K";
  options.http_threads = 4;
  options.ui = false;
  OpenAiServer quiet(*stack->scheduler, *stack->tokenizer, nullptr, "no chat", stack->metrics,
                     options);
  const int port = quiet.Bind().value();
  std::thread serving([&quiet] { EXPECT_TRUE(quiet.Serve().ok()); });
  httplib::Client quiet_client("127.0.0.1", port);
  for (const char* path : {"/", "/ui/state", "/ui/app.js", "/ui/style.css"}) {
    httplib::Result res = quiet_client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
  }
  httplib::Result health = quiet_client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  quiet.Stop();
  serving.join();
}

}  // namespace
}  // namespace tessera::serve
