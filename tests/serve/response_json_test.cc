// Response JSON: the completion object, SSE chunks and /v1/models, byte for byte
// where the wire format is pinned (OpenAI clients parse them), and logprobs in
// both endpoints' formats.
#include "serve/response_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stories_tokenizer.h"

namespace tessera::serve {
namespace {

using nlohmann::json;

ResponseJson Make(Endpoint endpoint, bool logprobs = false, int32_t top_logprobs = 0,
                  bool return_timing = false) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  return ResponseJson({.endpoint = endpoint,
                       .id = chat ? "chatcmpl-3" : "cmpl-3",
                       .created = 1700000000,
                       .model_name = "m",
                       .logprobs = logprobs,
                       .top_logprobs = top_logprobs,
                       .return_timing = return_timing},
                      StoriesTokenizer());
}

engine::TokenEvent Event(int32_t token, std::string text, float logprob,
                         std::vector<std::pair<int32_t, float>> top = {}) {
  engine::TokenEvent e;
  e.token = token;
  e.text = std::move(text);
  e.logprob = logprob;
  e.top_logprobs = std::move(top);
  return e;
}

engine::RequestResult ResultOf(engine::FinishReason reason, int64_t prompt, int64_t completion) {
  engine::RequestResult r;
  r.reason = reason;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  return r;
}

TEST(ResponseJsonTest, CompletionBody) {
  const std::vector<engine::TokenEvent> events = {Event(300, "Once", -0.5f),
                                                  Event(301, " upon", -0.25f)};
  HttpBody body = Make(Endpoint::kCompletions)
                      .FinishedBody("Hi ", events, ResultOf(engine::FinishReason::kLength, 2, 2));
  EXPECT_EQ(body.status, 200);
  EXPECT_EQ(body.json,
            R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,)"
            R"("text":"Hi Once upon"}],"created":1700000000,"id":"cmpl-3","model":"m",)"
            R"("object":"text_completion","usage":{"completion_tokens":2,"prompt_tokens":2,)"
            R"("prompt_tokens_details":{"cached_tokens":0},"total_tokens":4}})");
}

TEST(ResponseJsonTest, ChatBodyWithTiming) {
  const std::vector<engine::TokenEvent> events = {Event(300, "Hello", -0.5f)};
  engine::RequestResult result = ResultOf(engine::FinishReason::kStop, 5, 1);
  result.timing = {.queue_s = 0.5, .prefill_s = 0.25, .decode_s = 2, .comm_s = 0};
  HttpBody body = Make(Endpoint::kChatCompletions, false, 0, /*return_timing=*/true)
                      .FinishedBody("", events, result);
  EXPECT_EQ(body.status, 200);
  EXPECT_EQ(body.json,
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,)"
            R"("message":{"content":"Hello","role":"assistant"}}],"created":1700000000,)"
            R"("id":"chatcmpl-3","model":"m","object":"chat.completion",)"
            R"("usage":{"completion_tokens":1,"prompt_tokens":5,)"
            R"("prompt_tokens_details":{"cached_tokens":0},"tessera_timing":{"comm_ms":0.0,)"
            R"("decode_ms":2000.0,"prefill_ms":250.0,"queue_ms":500.0},"total_tokens":6}})");
}

TEST(ResponseJsonTest, FailedAndCancelledBodiesAreErrorObjects) {
  engine::RequestResult failed = ResultOf(engine::FinishReason::kError, 1, 0);
  failed.error = InternalError("boom");
  HttpBody body = Make(Endpoint::kCompletions).FinishedBody("", {}, failed);
  EXPECT_EQ(body.status, 500);
  json error = json::parse(body.json)["error"];
  EXPECT_EQ(error["message"], "generation failed: boom");
  EXPECT_EQ(error["type"], "server_error");
  body = Make(Endpoint::kChatCompletions)
             .FinishedBody("", {}, ResultOf(engine::FinishReason::kCancelled, 1, 0));
  EXPECT_EQ(body.status, 503);
  EXPECT_EQ(json::parse(body.json)["error"]["type"], "server_error");
}

TEST(ResponseJsonTest, CompletionLogprobsCountTheEchoInTextOffsets) {
  const model::Tokenizer& tok = StoriesTokenizer();
  const std::vector<engine::TokenEvent> events = {
      Event(300, "ab", -0.5f, {{300, -0.5f}, {301, -1.5f}}), Event(301, "c", -0.25f, {})};
  HttpBody body = Make(Endpoint::kCompletions, true, /*top_logprobs=*/1)
                      .FinishedBody("Hi", events, ResultOf(engine::FinishReason::kLength, 1, 2));
  json lp = json::parse(body.json)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({tok.TokenPiece(300), tok.TokenPiece(301)}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["top_logprobs"], json({json{{tok.TokenPiece(300), -0.5}}, json::object()}));
  EXPECT_EQ(lp["text_offset"], json({2, 4}));
}

TEST(ResponseJsonTest, ChatLogprobsListBytes) {
  const model::Tokenizer& tok = StoriesTokenizer();
  const std::vector<engine::TokenEvent> events = {Event(300, "x", -0.5f, {{301, -0.25f}})};
  HttpBody body = Make(Endpoint::kChatCompletions, true, 2)
                      .FinishedBody("", events, ResultOf(engine::FinishReason::kStop, 1, 1));
  json content = json::parse(body.json)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  const std::string piece = tok.TokenPiece(300), alt = tok.TokenPiece(301);
  EXPECT_EQ(content[0]["token"], piece);
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json(std::vector<int>(piece.begin(), piece.end())));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], alt);
  EXPECT_EQ(content[0]["top_logprobs"][0]["logprob"], -0.25);
}

TEST(ResponseJsonTest, CompletionStreamChunks) {
  ResponseJson j = Make(Endpoint::kCompletions);
  int64_t offset = 0;
  EXPECT_EQ(j.TextChunk("Once", {}, &offset),
            "data: "
            R"({"choices":[{"finish_reason":null,"index":0,"logprobs":null,"text":"Once"}],)"
            R"("created":1700000000,"id":"cmpl-3","model":"m","object":"text_completion"})"
            "\n\n");
  EXPECT_EQ(j.FinishChunk(ResultOf(engine::FinishReason::kLength, 1, 1)),
            "data: "
            R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":""}],)"
            R"("created":1700000000,"id":"cmpl-3","model":"m","object":"text_completion"})"
            "\n\n");
  EXPECT_EQ(j.UsageChunk(ResultOf(engine::FinishReason::kLength, 3, 1)),
            "data: "
            R"({"choices":[],"created":1700000000,"id":"cmpl-3","model":"m",)"
            R"("object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":3,)"
            R"("prompt_tokens_details":{"cached_tokens":0},"total_tokens":4}})"
            "\n\n");
  EXPECT_EQ(ResponseJson::kDoneEvent, "data: [DONE]\n\n");
}

TEST(ResponseJsonTest, ChatStreamChunks) {
  ResponseJson j = Make(Endpoint::kChatCompletions);
  int64_t offset = 0;
  const std::string head = R"({"choices":[{"delta":)";
  const std::string tail =
      R"(,"created":1700000000,"id":"chatcmpl-3","model":"m","object":"chat.completion.chunk"})"
      "\n\n";
  EXPECT_EQ(j.RoleChunk(), "data: " + head +
                               R"({"content":"","role":"assistant"},"finish_reason":null,)"
                               R"("index":0,"logprobs":null}])" +
                               tail);
  EXPECT_EQ(j.TextChunk("Hi", {}, &offset),
            "data: " + head +
                R"({"content":"Hi"},"finish_reason":null,"index":0,"logprobs":null}])" + tail);
  EXPECT_EQ(
      j.FinishChunk(ResultOf(engine::FinishReason::kCancelled, 1, 1)),
      "data: " + head + R"({},"finish_reason":"cancelled","index":0,"logprobs":null}])" + tail);
  engine::RequestResult failed = ResultOf(engine::FinishReason::kError, 1, 0);
  failed.error = InternalError("boom");
  const std::string error = j.FinishChunk(failed);
  ASSERT_EQ(error.rfind("data: ", 0), 0u);
  ASSERT_EQ(error.substr(error.size() - 2), "\n\n");
  EXPECT_EQ(json::parse(error.substr(6))["error"]["message"], "generation failed: boom");
}

TEST(ResponseJsonTest, StreamedLogprobsAdvanceTheOffsetAcrossChunks) {
  ResponseJson j = Make(Endpoint::kCompletions, true, 0);
  // A chunk without tokens (the echo alone) has no logprobs.
  int64_t echo_offset = 0;
  json echo = json::parse(j.TextChunk("Hi", {}, &echo_offset).substr(6));
  EXPECT_TRUE(echo["choices"][0]["logprobs"].is_null());
  int64_t offset = 0;
  const std::vector<engine::TokenEvent> a = {Event(300, "ab", -0.5f)};
  const std::vector<engine::TokenEvent> b = {Event(301, "cde", -0.5f)};
  json second = json::parse(j.TextChunk("ab", a, &offset).substr(6));
  json third = json::parse(j.TextChunk("cde", b, &offset).substr(6));
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(third["choices"][0]["logprobs"]["text_offset"], json({2}));
  EXPECT_EQ(offset, 5);
}

TEST(ResponseJsonTest, ModelList) {
  EXPECT_EQ(ModelListJson("stories", 1700000000, 512),
            R"({"data":[{"created":1700000000,"id":"stories","max_model_len":512,)"
            R"("object":"model","owned_by":"tessera"}],"object":"list"})");
}

}  // namespace
}  // namespace tessera::serve
