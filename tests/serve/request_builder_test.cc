// Request building: the prompt's tokens, the endpoints' default max_tokens against
// the scheduler's max_model_len, sampling fields; and the OpenAI error each kind
// of scheduler refusal becomes. On the stories260K tokenizer (512 tokens).
#include "serve/request_builder.h"

#include <gtest/gtest.h>

#include <string>

#include "stories_tokenizer.h"

namespace tessera::serve {
namespace {

ParsedRequest TokenPrompt(int num_tokens) {
  ParsedRequest r;
  r.prompt_tokens.assign(num_tokens, 100);
  r.prompt_is_tokens = true;
  return r;
}

ParsedRequest Chat(std::string content) {
  ParsedRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  r.messages = {{.role = "user", .content = std::move(content)}};
  return r;
}

BuildContext Context(int64_t max_model_len, const ChatTemplate* chat = nullptr) {
  return {.tokenizer = StoriesTokenizer(),
          .chat = chat,
          .chat_error = "no chat template here",
          .max_model_len = max_model_len,
          .seed_if_unset = 77};
}

engine::RequestParams Build(const ParsedRequest& r, const BuildContext& context) {
  ApiResult<engine::RequestParams> built = BuildRequestParams(r, context);
  EXPECT_TRUE(std::holds_alternative<engine::RequestParams>(built))
      << std::get<ApiError>(built).ToJson();
  if (!std::holds_alternative<engine::RequestParams>(built)) return {};
  return std::get<engine::RequestParams>(built);
}

TEST(RequestBuilderTest, ThePromptAsTokenIdsOrText) {
  ParsedRequest ids = TokenPrompt(3);
  EXPECT_EQ(Build(ids, Context(512)).prompt, ids.prompt_tokens);
  ParsedRequest text;
  text.prompt = "Once upon a time";
  EXPECT_EQ(Build(text, Context(512)).prompt, StoriesTokenizer().Encode("Once upon a time"));
}

TEST(RequestBuilderTest, CompletionsDefaultTo16TokensOrTheRoomLeft) {
  EXPECT_EQ(Build(TokenPrompt(3), Context(512)).max_tokens, 16);
  EXPECT_EQ(Build(TokenPrompt(3), Context(10)).max_tokens, 7);
  // No room: 0, which the scheduler refuses for this prompt length.
  EXPECT_EQ(Build(TokenPrompt(12), Context(10)).max_tokens, 0);
  ParsedRequest asked = TokenPrompt(3);
  asked.max_tokens = 400;  // not capped here: the scheduler judges it
  EXPECT_EQ(Build(asked, Context(10)).max_tokens, 400);
}

TEST(RequestBuilderTest, ChatDefaultsToTheRestOfTheContext) {
  const ChatTemplate chatml(ChatFamily::kChatMl, "<s>", "</s>");
  engine::RequestParams params = Build(Chat("Hi"), Context(512, &chatml));
  ASSERT_FALSE(params.prompt.empty());
  EXPECT_EQ(params.max_tokens, 512 - static_cast<int64_t>(params.prompt.size()));
  EXPECT_EQ(params.prompt,
            StoriesTokenizer().Encode(chatml.Render(Chat("Hi").messages).value(),
                                      {.add_special = false, .parse_special = true}));
}

TEST(RequestBuilderTest, ChatWithoutATemplateIsRefused) {
  ApiResult<engine::RequestParams> built = BuildRequestParams(Chat("Hi"), Context(512));
  ASSERT_TRUE(std::holds_alternative<ApiError>(built));
  const ApiError& error = std::get<ApiError>(built);
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.message, "no chat template here");
  EXPECT_EQ(error.param, "messages");
  EXPECT_EQ(error.code, "chat_template_unavailable");
}

TEST(RequestBuilderTest, SamplingFields) {
  ParsedRequest r = TokenPrompt(2);
  r.temperature = 0.5f;
  r.top_p = 0.9f;
  r.top_k = 40;
  r.min_p = 0.05f;
  r.repetition_penalty = 1.1f;
  r.presence_penalty = 0.25f;
  r.frequency_penalty = -0.5f;
  r.logit_bias = {{3, 1.5f}, {511, -100.0f}};
  r.stop = {"\n"};
  r.ignore_eos = true;
  r.logprobs = true;  // top_logprobs 0: the chosen token's only, which needs 1
  engine::RequestParams p = Build(r, Context(512));
  EXPECT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_EQ(p.sampling.min_p, 0.05f);
  EXPECT_EQ(p.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(p.sampling.presence_penalty, 0.25f);
  EXPECT_EQ(p.sampling.frequency_penalty, -0.5f);
  ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(p.sampling.logit_bias[1].token, 511);
  EXPECT_EQ(p.sampling.logit_bias[1].bias, -100.0f);
  EXPECT_EQ(p.sampling.seed, 77u);  // none named: the server's random one
  EXPECT_EQ(p.stop, r.stop);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.top_logprobs, 1);
  r.seed = 5;
  r.top_logprobs = 3;
  p = Build(r, Context(512));
  EXPECT_EQ(p.sampling.seed, 5u);
  EXPECT_EQ(p.top_logprobs, 3);
  r.logprobs = false;
  EXPECT_EQ(Build(r, Context(512)).top_logprobs, 0);
}

TEST(RequestBuilderTest, ALogitBiasOutsideTheVocabularyIsRefused) {
  ParsedRequest r = TokenPrompt(2);
  r.logit_bias = {{512, 1.0f}};
  ApiResult<engine::RequestParams> built = BuildRequestParams(r, Context(512));
  ASSERT_TRUE(std::holds_alternative<ApiError>(built));
  EXPECT_EQ(std::get<ApiError>(built).param, "logit_bias");
  EXPECT_NE(std::get<ApiError>(built).message.find("512"), std::string::npos);
}

TEST(RequestBuilderTest, RefusalsNameTheFieldAtFault) {
  const Status refusal = InvalidArgumentError("refused by the scheduler");
  const BuildContext context = Context(512);
  ParsedRequest outside = TokenPrompt(3);
  outside.prompt_tokens[1] = 512;
  ApiError e = RefusedRequestError(refusal, outside, 3, 16, context);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "token id 512 is outside the vocabulary (512 tokens)");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.code, "");

  e = RefusedRequestError(refusal, ParsedRequest{}, 0, 16, context);
  EXPECT_EQ(e.message, "the prompt encodes to no tokens");
  EXPECT_EQ(e.param, "prompt");

  e = RefusedRequestError(refusal, TokenPrompt(512), 512, 0, context);
  EXPECT_EQ(e.message,
            "the prompt is 512 tokens; this model's context is 512 tokens, which leaves no room "
            "to generate");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.code, "context_length_exceeded");
  e = RefusedRequestError(refusal, Chat("long"), 600, 0, context);
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.code, "context_length_exceeded");

  e = RefusedRequestError(refusal, TokenPrompt(500), 500, 13, context);
  EXPECT_EQ(e.message, "prompt (500 tokens) + max_tokens (13) exceeds the context of 512 tokens");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "context_length_exceeded");

  // Anything else (a sampling value, say): the scheduler's words, no param.
  e = RefusedRequestError(refusal, TokenPrompt(500), 500, 12, context);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "refused by the scheduler");
  EXPECT_EQ(e.param, "");
  EXPECT_EQ(e.code, "");
}

}  // namespace
}  // namespace tessera::serve
