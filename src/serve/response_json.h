// Response JSON: the bodies OpenAiServer sends for one accepted generation request
// — the non-streamed completion object, the Server-Sent Event chunks of a stream
// (text or chat deltas, the finish chunk, the usage chunk, [DONE]) and the
// log-probabilities in each endpoint's format — plus GET /v1/models' list. Pure
// (no I/O); layer: serve; the response writers (sse_response, plain_response) and
// openai_server call it. Thread-safe: const methods only.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "engine/scheduler.h"
#include "model/tokenizer.h"
#include "serve/request_parser.h"

namespace tessera::serve {

// What every response to one request shares.
struct ResponseFormat {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;              // "cmpl-N" or "chatcmpl-N"
  int64_t created = 0;         // Unix seconds
  std::string model_name;      // the served model
  bool logprobs = false;       // the request asked for log-probabilities
  int32_t top_logprobs = 0;    // alternatives listed per token
  bool return_timing = false;  // usage.tessera_timing
};

// An HTTP status and its JSON body.
struct HttpBody {
  int status = 200;
  std::string json;
};

class ResponseJson {
 public:
  // `tokenizer` must outlive this object (it turns token ids into pieces).
  ResponseJson(ResponseFormat format, const model::Tokenizer& tokenizer);

  const ResponseFormat& format() const { return format_; }

  // The whole answer to a non-streamed request once it finished: 200 with the
  // completion object (`echo` before the generated text), or the error object
  // (500 generation failed, 503 cancelled by shutdown).
  HttpBody FinishedBody(std::string_view echo, std::span<const engine::TokenEvent> events,
                        const engine::RequestResult& result) const;

  // SSE events, each "data: {…}\n\n". A chat stream's first chunk: the role.
  std::string RoleChunk() const;
  // Text (a chat delta's content) and, when asked for and `events` is not empty,
  // its tokens' log-probabilities; *text_offset advances over the tokens' text.
  std::string TextChunk(std::string text, std::span<const engine::TokenEvent> events,
                        int64_t* text_offset) const;
  // The chunk with finish_reason, or an error object when generation failed.
  std::string FinishChunk(const engine::RequestResult& result) const;
  // stream_options.include_usage: empty choices and the usage.
  std::string UsageChunk(const engine::RequestResult& result) const;
  static constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";

 private:
  nlohmann::json LogprobsJson(std::span<const engine::TokenEvent> events,
                              int64_t* text_offset) const;
  nlohmann::json UsageJson(const engine::RequestResult& result) const;
  std::string Chunk(nlohmann::json delta_or_text, nlohmann::json logprobs,
                    nlohmann::json finish_reason) const;

  ResponseFormat format_;
  const model::Tokenizer& tokenizer_;
};

// GET /v1/models: the one served model and the context a request may fill.
std::string ModelListJson(std::string_view model_name, int64_t created, int64_t max_model_len);

}  // namespace tessera::serve
