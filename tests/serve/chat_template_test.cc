// Chat templates: detection from real templates' markers, and each family's
// rendering of one 3-message conversation.
#include "serve/chat_template.h"

#include <gtest/gtest.h>

namespace tessera::serve {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}};
const std::vector<ChatMessage> kQuestion = {{"system", "Be brief."}, {"user", "Hi!"}};

std::string Render(ChatFamily family, const std::vector<ChatMessage>& messages) {
  ChatTemplate t(family, "<s>", "</s>");
  Result<std::string> text = t.Render(messages);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

TEST(ChatTemplate, DetectsFamilies) {
  // Excerpts of the templates these models ship.
  EXPECT_EQ(*DetectChatFamily(
                "{% set loop_messages = messages %}{% for message in loop_messages %}{% set "
                "content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
                "message['content'] | trim + '<|eot_id|>' %}"),
            ChatFamily::kLlama3);
  EXPECT_EQ(*DetectChatFamily("{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                              "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"),
            ChatFamily::kChatMl);
  EXPECT_EQ(*DetectChatFamily("{% if message['role'] == 'user' %}{{ '<|user|>\n' + "
                              "message['content'] + eos_token }}{% elif message['role'] == "
                              "'assistant' %}{{ '<|assistant|>\n' }}"),
            ChatFamily::kZephyr);
  EXPECT_EQ(*DetectChatFamily("{% set system_message = '<<SYS>>\\n' + messages[0]['content'] + "
                              "'\\n<</SYS>>\\n\\n' %}{{ bos_token + '[INST] ' + content + ' "
                              "[/INST]' }}"),
            ChatFamily::kLlama2);
  EXPECT_EQ(*DetectChatFamily("{{ bos_token }}{% for message in messages %}{% if "
                              "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
                              "' [/INST]' }}{% else %}{{ message['content'] + eos_token}}"),
            ChatFamily::kMistral);
}

TEST(ChatTemplate, RefusesUnknownTemplates) {
  Result<ChatFamily> unknown =
      DetectChatFamily("{% for m in messages %}<start_of_turn>{{ m.role }}{% endfor %}");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--chat-template"), std::string::npos);
  EXPECT_FALSE(DetectChatFamily("").ok());
  EXPECT_FALSE(ChatFamilyFromName("gemma").ok());
  EXPECT_EQ(*ChatFamilyFromName("llama3"), ChatFamily::kLlama3);
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(Render(ChatFamily::kLlama3, kConversation),
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ChatMl) {
  EXPECT_EQ(Render(ChatFamily::kChatMl, kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Zephyr) {
  EXPECT_EQ(Render(ChatFamily::kZephyr, kConversation),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi!</s>\n<|assistant|>\nHello.</s>\n"
            "<|assistant|>\n");
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(Render(ChatFamily::kLlama2, kConversation),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s>");
  EXPECT_EQ(Render(ChatFamily::kLlama2, kQuestion),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]");
}

TEST(ChatTemplate, Mistral) {
  EXPECT_EQ(Render(ChatFamily::kMistral, kConversation),
            "<s>[INST] Be brief.\n\nHi! [/INST]Hello.</s>");
  std::vector<ChatMessage> turns = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(Render(ChatFamily::kMistral, turns), "<s>[INST] a [/INST]b</s>[INST] c [/INST]");
}

// A base model (no template): the messages' text, one per line, to continue.
TEST(ChatTemplate, Plain) {
  EXPECT_EQ(Render(ChatFamily::kPlain, kConversation), "<s>Be brief.\nHi!\nHello.");
  EXPECT_EQ(Render(ChatFamily::kPlain, {{"user", "Once upon a time"}}), "<s>Once upon a time");
  EXPECT_EQ(*ChatFamilyFromName("plain"), ChatFamily::kPlain);
  EXPECT_EQ(ChatFamilyName(ChatFamily::kPlain), "plain");
}

TEST(ChatTemplate, RefusesConversationsAFamilyCannotExpress) {
  ChatTemplate llama2(ChatFamily::kLlama2, "<s>", "</s>");
  std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  EXPECT_FALSE(llama2.Render(two_users).ok());
  ChatTemplate chatml(ChatFamily::kChatMl, "", "");
  std::vector<ChatMessage> no_user = {{"system", "a"}};
  EXPECT_FALSE(chatml.Render(no_user).ok());
}

}  // namespace
}  // namespace tessera::serve
