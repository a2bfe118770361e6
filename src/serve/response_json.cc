#include "serve/response_json.h"

#include <utility>

namespace tessera::serve {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

json BytesOf(std::string_view s) {
  json bytes = json::array();
  for (char c : s) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

bool IsChat(const ResponseFormat& f) { return f.endpoint == Endpoint::kChatCompletions; }

}  // namespace

ResponseJson::ResponseJson(ResponseFormat format, const model::Tokenizer& tokenizer)
    : format_(std::move(format)), tokenizer_(tokenizer) {}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]};
// completions: {tokens, token_logprobs, top_logprobs: [{piece: logprob}], text_offset}.
json ResponseJson::LogprobsJson(std::span<const engine::TokenEvent> events,
                                int64_t* text_offset) const {
  const int32_t top_n = format_.top_logprobs;
  if (IsChat(format_)) {
    json content = json::array();
    for (const engine::TokenEvent& e : events) {
      const std::string piece = tokenizer_.TokenPiece(e.token);
      json top = json::array();
      for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int32_t>(i) < top_n; ++i) {
        const std::string p = tokenizer_.TokenPiece(e.top_logprobs[i].first);
        top.push_back({{"token", p}, {"logprob", e.top_logprobs[i].second}, {"bytes", BytesOf(p)}});
      }
      content.push_back({{"token", piece},
                         {"logprob", e.logprob},
                         {"bytes", BytesOf(piece)},
                         {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const engine::TokenEvent& e : events) {
    tokens.push_back(tokenizer_.TokenPiece(e.token));
    token_logprobs.push_back(e.logprob);
    json alternatives = json::object();
    for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int32_t>(i) < top_n; ++i) {
      alternatives[tokenizer_.TokenPiece(e.top_logprobs[i].first)] = e.top_logprobs[i].second;
    }
    top.push_back(alternatives);
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(e.text.size());
  }
  return json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

// Token counts (cached_tokens: prompt tokens whose KV came from the prefix cache),
// and with return_timing the scheduler's RequestTiming in milliseconds.
json ResponseJson::UsageJson(const engine::RequestResult& result) const {
  json usage = {{"prompt_tokens", result.prompt_tokens},
                {"completion_tokens", result.completion_tokens},
                {"total_tokens", result.prompt_tokens + result.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", result.cached_tokens}}}};
  if (result.kv_transfer_bytes > 0) {  // prefill/decode disaggregation (docs/pd.md)
    usage["tessera_kv_transfer"] = {{"tokens", result.kv_imported_tokens},
                                    {"bytes", result.kv_transfer_bytes},
                                    {"streamed_bytes", result.kv_streamed_bytes},
                                    {"transfer_ms", result.timing.kv_transfer_s * 1e3},
                                    {"handoff_ms", result.timing.kv_handoff_s * 1e3}};
  }
  if (format_.return_timing) {
    const engine::RequestTiming& t = result.timing;
    usage["tessera_timing"] = {{"queue_ms", t.queue_s * 1e3},
                               {"prefill_ms", t.prefill_s * 1e3},
                               {"decode_ms", t.decode_s * 1e3},
                               {"comm_ms", t.comm_s * 1e3}};
  }
  return usage;
}

HttpBody ResponseJson::FinishedBody(std::string_view echo,
                                    std::span<const engine::TokenEvent> events,
                                    const engine::RequestResult& result) const {
  if (result.reason == engine::FinishReason::kError) {
    return {500, ApiError{.http_status = 500,
                          .message = "generation failed: " + result.error.message(),
                          .type = "server_error"}
                     .ToJson()};
  }
  if (result.reason == engine::FinishReason::kCancelled) {
    return {503, ApiError{.http_status = 503,
                          .message = "the request was cancelled (the server is shutting down)",
                          .type = "server_error"}
                     .ToJson()};
  }
  std::string text(echo);
  for (const engine::TokenEvent& e : events) text += e.text;
  int64_t offset = static_cast<int64_t>(echo.size());
  json choice = {{"index", 0}, {"finish_reason", engine::FinishReasonName(result.reason)}};
  json lp = format_.logprobs ? LogprobsJson(events, &offset) : json(nullptr);
  if (IsChat(format_)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = lp;
  json body = {{"id", format_.id},
               {"object", IsChat(format_) ? "chat.completion" : "text_completion"},
               {"created", format_.created},
               {"model", format_.model_name},
               {"choices", json::array({choice})},
               {"usage", UsageJson(result)}};
  return {200, Dump(body)};
}

std::string ResponseJson::Chunk(json delta_or_text, json logprobs, json finish_reason) const {
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  if (IsChat(format_)) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  json body = {{"id", format_.id},
               {"object", IsChat(format_) ? "chat.completion.chunk" : "text_completion"},
               {"created", format_.created},
               {"model", format_.model_name},
               {"choices", json::array({choice})}};
  return Event(Dump(body));
}

std::string ResponseJson::RoleChunk() const {
  return Chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
}

std::string ResponseJson::TextChunk(std::string text, std::span<const engine::TokenEvent> events,
                                    int64_t* text_offset) const {
  json lp = format_.logprobs && !events.empty() ? LogprobsJson(events, text_offset) : json(nullptr);
  json delta_or_text = IsChat(format_) ? json{{"content", std::move(text)}} : json(std::move(text));
  return Chunk(std::move(delta_or_text), std::move(lp), nullptr);
}

std::string ResponseJson::FinishChunk(const engine::RequestResult& result) const {
  if (result.reason == engine::FinishReason::kError) {
    return Event(ApiError{.http_status = 500,
                          .message = "generation failed: " + result.error.message(),
                          .type = "server_error"}
                     .ToJson());
  }
  return Chunk(IsChat(format_) ? json::object() : json(""), nullptr,
               engine::FinishReasonName(result.reason));
}

std::string ResponseJson::UsageChunk(const engine::RequestResult& result) const {
  json body = {{"id", format_.id},
               {"object", IsChat(format_) ? "chat.completion.chunk" : "text_completion"},
               {"created", format_.created},
               {"model", format_.model_name},
               {"choices", json::array()},
               {"usage", UsageJson(result)}};
  return Event(Dump(body));
}

std::string ModelListJson(std::string_view model_name, int64_t created, int64_t max_model_len) {
  json model = {{"id", model_name},
                {"object", "model"},
                {"created", created},
                {"owned_by", "tessera"},
                {"max_model_len", max_model_len}};
  return Dump(json{{"object", "list"}, {"data", json::array({model})}});
}

}  // namespace tessera::serve
