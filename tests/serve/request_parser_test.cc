// The request parser: every bad input gets the right status and param; good
// requests come out with their fields.
#include "serve/request_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tessera::serve {
namespace {

using nlohmann::json;

ParserLimits Limits() {
  ParserLimits limits;
  limits.max_body_bytes = 4096;
  limits.max_tokens_limit = 512;
  return limits;
}

ApiError ExpectError(Endpoint endpoint, std::string_view body, int status = 400) {
  ApiResult<ParsedRequest> r = ParseRequest(endpoint, body, Limits());
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  if (!std::holds_alternative<ApiError>(r)) return {};
  ApiError error = std::get<ApiError>(r);
  EXPECT_EQ(error.http_status, status) << body << " → " << error.message;
  EXPECT_FALSE(error.message.empty());
  return error;
}

ParsedRequest ExpectOk(Endpoint endpoint, std::string_view body) {
  ApiResult<ParsedRequest> r = ParseRequest(endpoint, body, Limits());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused: " << body << " → " << e->message;
    return {};
  }
  return std::get<ParsedRequest>(r);
}

constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

TEST(RequestParser, CompletionFields) {
  ParsedRequest r = ExpectOk(
      kCmpl, R"({"model":"m","prompt":"Once","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":3,)"
             R"("seed":7,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},)"
             R"("logprobs":2,"n":1,"unknown_extra":{"x":1}})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
}

TEST(RequestParser, PromptForms) {
  EXPECT_EQ(ExpectOk(kCmpl, R"({"prompt":["x"]})").prompt, "x");
  ParsedRequest tokens = ExpectOk(kCmpl, R"({"prompt":[1,2,3]})");
  EXPECT_TRUE(tokens.prompt_is_tokens);
  EXPECT_EQ(tokens.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":["x","y"]})").param, "prompt");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":[1,-2]})").param, "prompt");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":""})").param, "prompt");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":[]})").param, "prompt");
  EXPECT_EQ(ExpectError(kCmpl, R"({"max_tokens":3})").param, "prompt");
}

TEST(RequestParser, ChatMessages) {
  ParsedRequest r = ExpectOk(
      kChat,
      R"({"messages":[{"role":"system","content":"s"},)"
      R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],)"
      R"("logprobs":true,"top_logprobs":3,"max_completion_tokens":9})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(ExpectError(kChat, R"({"messages":[]})").param, "messages");
  EXPECT_EQ(ExpectError(kChat, R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(ExpectError(kChat, R"({"messages":[{"role":"tool","content":"x"}]})").param,
            "messages[0].role");
  EXPECT_EQ(ExpectError(kChat, R"({"messages":[{"role":"user","content":5}]})").param,
            "messages[0].content");
  EXPECT_EQ(ExpectError(kChat, R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(
      ExpectError(kChat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})").param,
      "top_logprobs");
}

TEST(RequestParser, MalformedBodies) {
  ExpectError(kCmpl, R"({"prompt":"x")");
  ExpectError(kCmpl, "");
  ExpectError(kCmpl, "[1,2]");
  ExpectError(kCmpl, "\"just a string\"");
  ExpectError(kCmpl, R"({"prompt":"x"} trailing)");
  EXPECT_NE(ExpectError(kCmpl, "{\"prompt\":\"\xff\xfe\"}").message.find("UTF-8"),
            std::string::npos);
  ExpectError(kCmpl, "{\"prompt\":\"\xc0\x80\"}");                    // overlong NUL
  ExpectError(kCmpl, "{\"prompt\":\"\xed\xa0\x80\"}");                // a surrogate
  ExpectError(kCmpl, std::string(100, '[') + std::string(100, ']'));  // too deep
}

TEST(RequestParser, BodyTooLarge) {
  std::string body = R"({"prompt":")";
  body.append(5000, 'a');
  body += "\"}";
  ExpectError(kCmpl, body, 413);
}

TEST(RequestParser, WrongTypes) {
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":"5"})").param, "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":5.5})").param, "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","temperature":"hot"})").param, "temperature");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stream":1})").param, "stream");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stop":7})").param, "stop");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stop":["a",1]})").param, "stop");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","model":3})").param, "model");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","seed":"1"})").param, "seed");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","user":{}})").param, "user");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","logprobs":true})").param, "logprobs");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stream":true,"stream_options":1})").param,
            "stream_options");
  EXPECT_EQ(
      ExpectError(kCmpl, R"({"prompt":"x","stream":true,"stream_options":{"include_usage":"y"}})")
          .param,
      "stream_options.include_usage");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stream_options":{"include_usage":true}})").param,
            "stream_options");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":7})").param, "prompt");
}

TEST(RequestParser, Ranges) {
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":-1})").param, "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":513})").param, "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","max_tokens":99999999999999999999})").param,
            "max_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","temperature":-0.1})").param, "temperature");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","temperature":2.5})").param, "temperature");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","top_p":0})").param, "top_p");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","top_p":1.5})").param, "top_p");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","top_k":-2})").param, "top_k");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","n":2})").param, "n");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","logprobs":21})").param, "logprobs");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","stop":["a","b","c","d","e"]})").param, "stop");
  EXPECT_EQ(ExpectOk(kCmpl, R"({"prompt":"x","n":1,"max_tokens":512,"top_k":-1})").top_k, 0);
}

TEST(RequestParser, SpecTokens) {
  EXPECT_EQ(ExpectOk(kCmpl, R"({"prompt":"x"})").spec_tokens, -1);  // the server's default
  EXPECT_EQ(ExpectOk(kCmpl, R"({"prompt":"x","spec_tokens":0})").spec_tokens, 0);
  EXPECT_EQ(ExpectOk(kChat, R"({"messages":[{"role":"user","content":"hi"}],"spec_tokens":16})")
                .spec_tokens,
            16);
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","spec_tokens":17})").param, "spec_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","spec_tokens":-1})").param, "spec_tokens");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","spec_tokens":"4"})").param, "spec_tokens");
}

TEST(RequestParser, PenaltiesAndLogitBias) {
  ParsedRequest r =
      ExpectOk(kCmpl, R"({"prompt":"x","presence_penalty":0.5,)"
                      R"("frequency_penalty":-1.5,"logit_bias":{"7":-100,"42":2.5}})");
  EXPECT_EQ(r.presence_penalty, 0.5f);
  EXPECT_EQ(r.frequency_penalty, -1.5f);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int64_t, float>>{{7, -100.0f}, {42, 2.5f}}));
  EXPECT_TRUE(ExpectOk(kCmpl, R"({"prompt":"x","logit_bias":{}})").logit_bias.empty());
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","presence_penalty":2.5})").param,
            "presence_penalty");
  EXPECT_EQ(ExpectError(kCmpl, R"({"prompt":"x","frequency_penalty":-3})").param,
            "frequency_penalty");
  for (const char* bad :
       {R"({"prompt":"x","logit_bias":[1]})", R"({"prompt":"x","logit_bias":{"a":1}})",
        R"({"prompt":"x","logit_bias":{"-1":1}})", R"({"prompt":"x","logit_bias":{"1.5":1}})",
        R"({"prompt":"x","logit_bias":{"99999999999":1}})",
        R"({"prompt":"x","logit_bias":{"1":101}})", R"({"prompt":"x","logit_bias":{"1":"5"}})"}) {
    EXPECT_EQ(ExpectError(kCmpl, bad).param, "logit_bias") << bad;
  }
  std::string many = R"({"prompt":"x","logit_bias":{)";
  for (int i = 0; i < 301; ++i) many += (i ? "," : "") + ("\"" + std::to_string(i) + "\":1");
  many += "}}";
  ParserLimits limits = Limits();
  limits.max_body_bytes = 1 << 16;
  ApiResult<ParsedRequest> refused = ParseRequest(kCmpl, many, limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "logit_bias");
}

TEST(RequestParser, UnimplementedFieldsAreRefusedByName) {
  for (const char* body :
       {R"({"messages":[{"role":"user","content":"x"}],)"
        R"("response_format":{"type":"json_object"}})",
        R"({"messages":[{"role":"user","content":"x"}],)"
        R"("tools":[{"type":"function","function":{"name":"f"}}]})",
        R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})",
        R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})",
        R"({"messages":[{"role":"user","content":"x"}],"function_call":"auto"})"}) {
    ApiError e = ExpectError(kChat, body);
    EXPECT_EQ(e.code, "unsupported_parameter") << body;
    EXPECT_NE(e.message.find("not supported"), std::string::npos) << e.message;
    EXPECT_NE(std::string(body).find(e.param), std::string::npos) << e.param;
  }
  // Their "off" values are what no field means.
  ExpectOk(kChat,
           R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"},)"
           R"("tools":[],"tool_choice":"none","functions":null,"function_call":"none"})");
  EXPECT_EQ(ExpectError(kChat, R"({"messages":[{"role":"user","content":"x"}],)"
                               R"("response_format":"json"})")
                .param,
            "response_format");
}

TEST(RequestParser, ErrorJsonShape) {
  ApiError error = ExpectError(kCmpl, R"({"prompt":"x","n":3})");
  json j = json::parse(error.ToJson());
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(RequestParser, Utf8Validator) {
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong
}

}  // namespace
}  // namespace tessera::serve
