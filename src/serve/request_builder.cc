#include "serve/request_builder.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tessera::serve {
namespace {

// The prompt's tokens, or a 400 when a chat cannot be rendered.
ApiResult<std::vector<int32_t>> PromptTokens(const ParsedRequest& r, const BuildContext& c) {
  if (r.endpoint == Endpoint::kChatCompletions) {
    if (c.chat == nullptr) {
      return ApiError{.message = std::string(c.chat_error),
                      .param = "messages",
                      .code = "chat_template_unavailable"};
    }
    Result<std::string> text = c.chat->Render(r.messages);
    if (!text.ok()) return ApiError{.message = text.status().message(), .param = "messages"};
    return c.tokenizer.Encode(*text, {.add_special = false, .parse_special = true});
  }
  if (r.prompt_is_tokens) return r.prompt_tokens;
  return c.tokenizer.Encode(r.prompt);
}

}  // namespace

ApiResult<engine::RequestParams> BuildRequestParams(const ParsedRequest& r,
                                                    const BuildContext& context) {
  engine::RequestParams params;
  ApiResult<std::vector<int32_t>> prompt = PromptTokens(r, context);
  if (auto* error = std::get_if<ApiError>(&prompt)) return std::move(*error);
  params.prompt = std::move(std::get<std::vector<int32_t>>(prompt));
  // A prompt that leaves no room is the scheduler's to refuse; 0 here means nothing.
  const int64_t room =
      std::max<int64_t>(0, context.max_model_len - static_cast<int64_t>(params.prompt.size()));
  if (r.max_tokens) {
    params.max_tokens = *r.max_tokens;
  } else {
    params.max_tokens =
        r.endpoint == Endpoint::kChatCompletions ? room : std::min<int64_t>(16, room);
  }
  params.sampling.temperature = r.temperature;
  params.sampling.top_p = r.top_p;
  params.sampling.top_k = r.top_k;
  params.sampling.min_p = r.min_p;
  params.sampling.repeat_penalty = r.repetition_penalty;
  params.sampling.presence_penalty = r.presence_penalty;
  params.sampling.frequency_penalty = r.frequency_penalty;
  const int64_t vocab = context.tokenizer.vocab_size();
  for (const auto& [token, bias] : r.logit_bias) {
    if (token >= vocab) {
      return ApiError{.message = "logit_bias names token " + std::to_string(token) +
                                 ", outside the vocabulary (" + std::to_string(vocab) + " tokens)",
                      .param = "logit_bias"};
    }
    params.sampling.logit_bias.push_back({static_cast<int32_t>(token), bias});
  }
  params.sampling.seed = r.seed ? *r.seed : context.seed_if_unset;
  params.stop = r.stop;
  params.ignore_eos = r.ignore_eos;
  params.top_logprobs = r.logprobs ? std::max(1, r.top_logprobs) : 0;
  params.spec_tokens = r.spec_tokens;
  return params;
}

ApiError RefusedRequestError(const Status& refusal, const ParsedRequest& r,
                             int64_t num_prompt_tokens, int64_t max_tokens,
                             const BuildContext& context) {
  // Only a prompt given as token ids can hold ids the tokenizer did not make.
  const int64_t vocab = context.tokenizer.vocab_size();
  for (int32_t id : r.prompt_tokens) {
    if (id < 0 || id >= vocab) {
      return {.message = "token id " + std::to_string(id) + " is outside the vocabulary (" +
                         std::to_string(vocab) + " tokens)",
              .param = "prompt"};
    }
  }
  if (num_prompt_tokens == 0) {
    return {.message = "the prompt encodes to no tokens", .param = "prompt"};
  }
  const int64_t max_model_len = context.max_model_len;
  if (num_prompt_tokens >= max_model_len) {
    return {.message = "the prompt is " + std::to_string(num_prompt_tokens) +
                       " tokens; this model's context is " + std::to_string(max_model_len) +
                       " tokens, which leaves no room to generate",
            .param = r.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt",
            .code = "context_length_exceeded"};
  }
  if (num_prompt_tokens + max_tokens > max_model_len) {
    return {.message = "prompt (" + std::to_string(num_prompt_tokens) + " tokens) + max_tokens (" +
                       std::to_string(max_tokens) + ") exceeds the context of " +
                       std::to_string(max_model_len) + " tokens",
            .param = "max_tokens",
            .code = "context_length_exceeded"};
  }
  return {.message = refusal.message()};
}

}  // namespace tessera::serve
