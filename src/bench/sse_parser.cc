#include "bench/sse_parser.h"

#include <nlohmann/json.hpp>

namespace tessera::bench {

void SseParser::Feed(std::string_view bytes, const DataCallback& on_data) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_line_.append(bytes);
      return;
    }
    std::string_view piece = bytes.substr(0, newline);
    bytes.remove_prefix(newline + 1);
    if (partial_line_.empty()) {
      HandleLine(piece, on_data);
    } else {
      partial_line_.append(piece);
      std::string line = std::move(partial_line_);
      partial_line_.clear();
      HandleLine(line, on_data);
    }
  }
}

void SseParser::Finish(const DataCallback& on_data) {
  if (!partial_line_.empty()) {
    std::string line = std::move(partial_line_);
    partial_line_.clear();
    HandleLine(line, on_data);
  }
  HandleLine("", on_data);
}

void SseParser::HandleLine(std::string_view line, const DataCallback& on_data) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) {  // end of event
    if (has_data_) {
      std::string data = std::move(event_data_);
      event_data_.clear();
      has_data_ = false;
      on_data(data);
    }
    return;
  }
  if (line.front() == ':') return;  // comment / keep-alive
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return;
  std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) event_data_.push_back('\n');
  event_data_.append(value);
  has_data_ = true;
}

namespace {

std::optional<int64_t> IntField(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_number()) return std::nullopt;
  return it->get<int64_t>();
}

void AppendStringField(const nlohmann::json& obj, const char* name, std::string& out) {
  auto it = obj.find(name);
  if (it != obj.end() && it->is_string()) out += it->get_ref<const std::string&>();
}

}  // namespace

Result<StreamChunk> ParseStreamChunk(std::string_view payload) {
  StreamChunk chunk;
  if (payload == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("stream chunk is not a JSON object: '" +
                                std::string(payload.substr(0, 200)) + "'");
  }
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    if (it->is_object() && it->contains("message") && (*it)["message"].is_string()) {
      chunk.error = (*it)["message"].get<std::string>();
    } else {
      chunk.error = it->dump();
    }
    if (chunk.error.empty()) chunk.error = "server sent an error chunk";
  }
  if (auto it = j.find("choices"); it != j.end() && it->is_array() && !it->empty()) {
    const nlohmann::json& choice = (*it)[0];
    if (choice.is_object()) {
      AppendStringField(choice, "text", chunk.text);
      if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        AppendStringField(*delta, "reasoning_content", chunk.text);
        AppendStringField(*delta, "content", chunk.text);
      }
    }
  }
  if (auto it = j.find("usage"); it != j.end() && it->is_object()) {
    chunk.prompt_tokens = IntField(*it, "prompt_tokens");
    chunk.completion_tokens = IntField(*it, "completion_tokens");
    if (auto d = it->find("prompt_tokens_details"); d != it->end() && d->is_object()) {
      chunk.cached_tokens = IntField(*d, "cached_tokens");
    }
  }
  return chunk;
}

}  // namespace tessera::bench
