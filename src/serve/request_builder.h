// Request building: a parsed generation request → the scheduler's RequestParams
// (the prompt's tokens — a chat rendered with its template, text encoded, or token
// ids as given —, max_tokens with the endpoint's default, sampling parameters),
// and the OpenAI error for a request the scheduler refused. The scheduler alone
// decides whether a request fits (token ids, context length, sampling values);
// this file only fills the defaults and shapes its refusals. Pure (no I/O);
// layer: serve; OpenAiServer calls it. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "engine/scheduler.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/request_parser.h"

namespace tessera::serve {

// What the request is built against.
struct BuildContext {
  const model::Tokenizer& tokenizer;
  const ChatTemplate* chat;  // null: chat requests are refused with chat_error
  std::string_view chat_error;
  int64_t max_model_len = 0;   // the scheduler's: bounds the default max_tokens
  uint64_t seed_if_unset = 0;  // the sampling seed when the request names none
};

// Without max_tokens a chat request may generate until the context is full and a
// completion 16 tokens (fewer if the context ends first). Errors (400): chat
// without a template, a conversation the template cannot render.
ApiResult<engine::RequestParams> BuildRequestParams(const ParsedRequest& request,
                                                    const BuildContext& context);

// The 400 for a request that Scheduler::Submit refused with InvalidArgument
// (`refusal`), built with num_prompt_tokens and max_tokens, naming the field at fault: a prompt
// token outside the vocabulary or an empty prompt (param "prompt"); a prompt that leaves no room in
// the context (code context_length_exceeded, param "prompt" or "messages"); prompt + max_tokens
// beyond it (context_length_exceeded, param "max_tokens"). Anything else keeps the scheduler's
// message, without a param.
ApiError RefusedRequestError(const Status& refusal, const ParsedRequest& request,
                             int64_t num_prompt_tokens, int64_t max_tokens,
                             const BuildContext& context);

}  // namespace tessera::serve
