// Chat templates: turns a conversation into the prompt text a chat model was
// trained on. GGUF files carry a Jinja template (tokenizer.chat_template); rather
// than run Jinja, tessera recognises the template's family by its distinctive
// markers and renders that family's format in C++: llama-2, llama-3, chatml,
// mistral and zephyr. An unrecognised template is refused with a message, never
// guessed. A model with no template at all (a base model) gets "plain": the
// messages' contents one per line, no role markers, for the model to continue. Layer: serve; the
// chat route and `tessera serve --chat-template` use it. Immutable after construction: Render is
// safe from many threads.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "serve/request_parser.h"

namespace tessera::serve {

enum class ChatFamily { kLlama2, kLlama3, kChatMl, kMistral, kZephyr, kPlain };

std::string_view ChatFamilyName(ChatFamily family);  // "llama-2", "llama-3", "chatml", …
// The family a name ("chatml", "llama-3", "llama3", …) denotes; NotFound otherwise.
Result<ChatFamily> ChatFamilyFromName(std::string_view name);
// The family of a Jinja template, by its markers (<|start_header_id|> → llama-3,
// <|im_start|> → chatml, <|user|>/<|assistant|> → zephyr, [INST] with <<SYS>> →
// llama-2, [INST] alone → mistral). InvalidArgument naming the supported ones
// when none matches.
Result<ChatFamily> DetectChatFamily(std::string_view jinja_template);

class ChatTemplate {
 public:
  // bos/eos: the vocabulary's BOS and EOS token texts ("<s>", "</s>"), written
  // where the family's template writes bos_token/eos_token. The rendered text is
  // meant to be encoded with special tokens parsed and no BOS added.
  ChatTemplate(ChatFamily family, std::string bos_token, std::string eos_token);

  ChatFamily family() const { return family_; }
  // The prompt for `messages`, ending with the assistant's turn opening
  // (add_generation_prompt). InvalidArgument when the family cannot express the
  // conversation (no user message; llama-2/mistral: roles that do not alternate).
  Result<std::string> Render(std::span<const ChatMessage> messages) const;

 private:
  ChatFamily family_;
  std::string bos_, eos_;
};

}  // namespace tessera::serve
