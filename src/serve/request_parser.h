// Request parsing: the JSON body of POST /v1/completions and
// /v1/chat/completions → validated request parameters, or an OpenAI-style error
// object ({"error":{"message","type","param","code"}}) naming the bad field.
// Pure (no I/O, no model): the HTTP handlers and the fuzzer call it. Layer: serve.
// Thread-safe (no state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tessera::serve {

// An error as the OpenAI API reports it, with the HTTP status to send.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("" = none → null)
  std::string code;   // "" → null
  // {"error":{"message":…,"type":…,"param":…|null,"code":…|null}}
  std::string ToJson() const;
};

template <typename T>
using ApiResult = std::variant<T, ApiError>;

enum class Endpoint { kCompletions, kChatCompletions };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct ParserLimits {
  size_t max_body_bytes = 1 << 20;
  int64_t max_tokens_limit = 1 << 20;  // max_tokens above this is refused (the context length)
  int32_t max_logprobs = 20;
  size_t max_stop_strings = 4;
  size_t max_messages = 1024;
  size_t max_logit_bias = 300;  // entries of logit_bias (OpenAI's limit)
};

// Everything a request asks for, validated (types and ranges); the server still
// checks the model name and the tokenized prompt's length.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when not given
  // Completions: the prompt as text, or as token ids.
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  // Chat.
  std::vector<ChatMessage> messages;

  std::optional<int64_t> max_tokens;  // absent: the endpoint's default
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 or -1: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // logit_bias: token id -> bias in [-100, 100]; ids are checked against the
  // vocabulary when the request is built.
  std::vector<std::pair<int64_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: prepend the prompt to the text
  bool ignore_eos = false;
  // tessera extension: "return_timing": true adds usage.tessera_timing (queue,
  // prefill, decode and communication milliseconds of this request).
  bool return_timing = false;
  // tessera extension: "spec_tokens": K speculative guesses per step at most
  // (0: none for this request; absent: the server's --spec-tokens).
  int32_t spec_tokens = -1;
  // Completions: logprobs = k (top-k alternatives, 0 = only the chosen token's);
  // chat: logprobs = true plus top_logprobs = k.
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// Parses `body` for `endpoint`. Refuses: a body over limits.max_body_bytes (413),
// invalid UTF-8, malformed JSON, a non-object body, known fields of the wrong type
// or out of range (max_tokens < 1 or above the limit, temperature outside [0, 2],
// top_p outside (0, 1], n != 1, …), an empty prompt / message list, and the
// OpenAI fields tessera does not implement, by name (response_format other than
// text, tools, tool_choice, functions, function_call: a 400 with code
// "unsupported_parameter" instead of an answer that ignores them). Unknown fields
// are ignored, as OpenAI clients send extras.
ApiResult<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                      const ParserLimits& limits);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool IsValidUtf8(std::string_view text);

}  // namespace tessera::serve
