#include "serve/chat_template.h"

#include <optional>

namespace tessera::serve {
namespace {

bool Contains(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

// llama-2 and mistral: an optional leading system message, then user/assistant
// turns alternating from a user turn.
Status CheckAlternation(std::span<const ChatMessage> messages, std::string_view family) {
  size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < messages.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != want) {
      return InvalidArgumentError(std::string(family) +
                                  " chat needs an optional system message, then user and "
                                  "assistant messages alternating from a user message; message " +
                                  std::to_string(i) + " is '" + messages[i].role + "'");
    }
  }
  if (messages.size() == first) {
    return InvalidArgumentError(std::string(family) + " chat needs at least one user message");
  }
  return Status::Ok();
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kLlama2:
      return "llama-2";
    case ChatFamily::kLlama3:
      return "llama-3";
    case ChatFamily::kChatMl:
      return "chatml";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kZephyr:
      return "zephyr";
    case ChatFamily::kPlain:
      return "plain";
  }
  return "?";
}

Result<ChatFamily> ChatFamilyFromName(std::string_view name) {
  if (name == "llama-2" || name == "llama2") return ChatFamily::kLlama2;
  if (name == "llama-3" || name == "llama3") return ChatFamily::kLlama3;
  if (name == "chatml") return ChatFamily::kChatMl;
  if (name == "mistral") return ChatFamily::kMistral;
  if (name == "zephyr") return ChatFamily::kZephyr;
  if (name == "plain") return ChatFamily::kPlain;
  return NotFoundError("unknown chat template family '" + std::string(name) +
                       "' (known: llama-2, llama-3, chatml, mistral, zephyr)");
}

Result<ChatFamily> DetectChatFamily(std::string_view t) {
  if (Contains(t, "<|start_header_id|>") && Contains(t, "<|eot_id|>")) return ChatFamily::kLlama3;
  if (Contains(t, "<|im_start|>") && Contains(t, "<|im_end|>")) return ChatFamily::kChatMl;
  if (Contains(t, "<|user|>") && Contains(t, "<|assistant|>")) return ChatFamily::kZephyr;
  if (Contains(t, "[INST]") && Contains(t, "<<SYS>>")) return ChatFamily::kLlama2;
  if (Contains(t, "[INST]") && Contains(t, "[/INST]")) return ChatFamily::kMistral;
  return InvalidArgumentError(
      "the model's chat template (tokenizer.chat_template) is not one tessera can render "
      "(supported families: llama-2, llama-3, chatml, mistral, zephyr); start the server with "
      "--chat-template FAMILY to choose one");
}

ChatTemplate::ChatTemplate(ChatFamily family, std::string bos_token, std::string eos_token)
    : family_(family), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {}

Result<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages) const {
  bool has_user = false;
  for (const ChatMessage& m : messages) has_user |= m.role == "user";
  if (!has_user) return InvalidArgumentError("the conversation has no user message");
  std::string out;
  switch (family_) {
    case ChatFamily::kLlama3:
      out = bos_;
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFamily::kChatMl:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      out += "<|im_start|>assistant\n";
      return out;
    case ChatFamily::kPlain:  // a base model continues the conversation's text
      out = bos_;
      for (size_t i = 0; i < messages.size(); ++i) {
        out += (i == 0 ? "" : "\n") + messages[i].content;
      }
      return out;
    case ChatFamily::kZephyr:
      for (const ChatMessage& m : messages) {
        out += "<|" + m.role + "|>\n" + m.content + eos_ + "\n";
      }
      out += "<|assistant|>\n";
      return out;
    case ChatFamily::kLlama2: {
      TESSERA_RETURN_IF_ERROR(CheckAlternation(messages, "llama-2"));
      size_t i = 0;
      std::string system;
      if (messages[0].role == "system") system = messages[i++].content;
      for (; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
          std::string content = m.content;
          if (!system.empty()) {
            content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
            system.clear();
          }
          out += bos_ + "[INST] " + content + " [/INST]";
        } else {
          out += " " + m.content + " " + eos_;
        }
      }
      return out;
    }
    case ChatFamily::kMistral: {
      TESSERA_RETURN_IF_ERROR(CheckAlternation(messages, "mistral"));
      size_t i = 0;
      std::string system;
      if (messages[0].role == "system") system = messages[i++].content;
      out = bos_;
      for (; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
          std::string content = m.content;
          if (!system.empty()) {  // mistral has no system role: it leads the first user turn
            content = system + "\n\n" + content;
            system.clear();
          }
          out += "[INST] " + content + " [/INST]";
        } else {
          out += m.content + eos_;
        }
      }
      return out;
    }
  }
  return InternalError("unhandled chat family");
}

}  // namespace tessera::serve
