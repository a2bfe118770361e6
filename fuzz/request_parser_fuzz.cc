// libFuzzer target for the HTTP request parser: any body, for either endpoint,
// must give a ParsedRequest or an ApiError with a 4xx status and an error JSON
// that parses back — never a crash, a hang or an exception. Accepted chat
// requests are further rendered by every chat template family. Corpus:
// fuzz/corpus/request_parser (small valid and invalid request bodies).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "serve/chat_template.h"
#include "serve/request_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::serve;
  if (size == 0) return 0;
  // The first byte picks the endpoint; the rest is the body.
  const Endpoint endpoint = data[0] & 1 ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  ParserLimits limits;
  limits.max_body_bytes = 32 << 10;
  limits.max_tokens_limit = 4096;
  ApiResult<ParsedRequest> result = ParseRequest(endpoint, body, limits);
  if (const auto* error = std::get_if<ApiError>(&result)) {
    if (error->http_status < 400 || error->http_status > 499 || error->message.empty()) abort();
    nlohmann::json j = nlohmann::json::parse(error->ToJson(), nullptr, false);
    if (j.is_discarded() || !j["error"]["message"].is_string()) abort();
    return 0;
  }
  const ParsedRequest& r = std::get<ParsedRequest>(result);
  if (r.max_tokens && (*r.max_tokens < 1 || *r.max_tokens > limits.max_tokens_limit)) abort();
  if (!(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p > 0 && r.top_p <= 1)) abort();
  if (r.endpoint == Endpoint::kChatCompletions) {
    if (r.messages.empty()) abort();
    for (ChatFamily family : {ChatFamily::kLlama2, ChatFamily::kLlama3, ChatFamily::kChatMl,
                              ChatFamily::kMistral, ChatFamily::kZephyr}) {
      ChatTemplate chat(family, "<s>", "</s>");
      (void)chat.Render(r.messages);
    }
  } else if (!r.prompt_is_tokens && r.prompt.empty()) {
    abort();
  }
  return 0;
}
