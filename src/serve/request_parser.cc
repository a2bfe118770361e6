#include "serve/request_parser.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/scheduler.h"  // kMaxSpecTokens

namespace tessera::serve {
namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 64;

ApiError Bad(std::string param, std::string message, std::string code = "") {
  ApiError error;
  error.http_status = 400;
  error.param = std::move(param);
  error.message = std::move(message);
  error.code = std::move(code);
  return error;
}

// Nesting depth of `body` outside strings (nlohmann's destructor recurses on
// nesting, so a body like [[[[…]]]] is refused before it is parsed).
bool NestingWithin(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

std::string WrongType(std::string_view field, std::string_view want, const json& v) {
  return "'" + std::string(field) + "' must be " + std::string(want) + ", not " + TypeName(v);
}

// Each Get* sets `*out` when the field is present and not null; an error otherwise.
std::optional<ApiError> GetBool(const json& body, const char* field, bool* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Bad(field, WrongType(field, "a boolean", *it));
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetNumber(const json& body, const char* field, double lo, double hi,
                                  bool lo_open, float* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(field, WrongType(field, "a number", *it));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
    return Bad(field, "'" + std::string(field) + "' must be in " + (lo_open ? "(" : "[") +
                          std::to_string(lo).substr(0, 3) + ", " + std::to_string(hi).substr(0, 3) +
                          "], got " + it->dump());
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& body, const char* field, int64_t lo, int64_t hi,
                               std::optional<int64_t>* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return Bad(field, WrongType(field, "an integer", *it));
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(field, "'" + std::string(field) + "' must be at most " + std::to_string(hi) +
                          ", got " + it->dump());
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Bad(field, "'" + std::string(field) + "' must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + std::to_string(v));
  }
  *out = v;
  return std::nullopt;
}

// {"123": -100, "9": 5.5}: token ids as decimal strings, biases in [-100, 100];
// sorted by token id.
std::optional<ApiError> ParseLogitBias(const json& body, const ParserLimits& limits,
                                       ParsedRequest* r) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return Bad("logit_bias", WrongType("logit_bias", "an object", *it));
  if (it->size() > limits.max_logit_bias) {
    return Bad("logit_bias", "at most " + std::to_string(limits.max_logit_bias) + " entries");
  }
  for (const auto& [key, value] : it->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t token = digits ? std::stoll(key) : -1;
    if (!digits || token > INT32_MAX) {
      return Bad("logit_bias",
                 "'logit_bias' keys must be token ids, got \"" + key.substr(0, 32) + "\"");
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100) {
      return Bad("logit_bias",
                 "'logit_bias' values must be numbers in [-100, 100], got " + value.dump());
    }
    r->logit_bias.emplace_back(token, value.get<float>());
  }
  std::sort(r->logit_bias.begin(), r->logit_bias.end());
  for (size_t i = 1; i < r->logit_bias.size(); ++i) {
    if (r->logit_bias[i].first == r->logit_bias[i - 1].first) {
      return Bad("logit_bias",
                 "'logit_bias' names token " + std::to_string(r->logit_bias[i].first) + " twice");
    }
  }
  return std::nullopt;
}

// Fields of the OpenAI API that would change the answer and that tessera does not
// implement: refused by name rather than ignored. Their "off" values pass.
std::optional<ApiError> RefuseUnsupported(const json& body) {
  const auto unsupported = [](const char* field, std::string_view why) {
    return Bad(
        field,
        "'" + std::string(field) + "' is not supported by this server (" + std::string(why) + ")",
        "unsupported_parameter");
  };
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Bad("response_format", WrongType("response_format", "an object", *it));
    }
    auto type = it->find("type");
    if (type == it->end() || !type->is_string() || type->get<std::string>() != "text") {
      return unsupported("response_format", "only {\"type\": \"text\"}: no JSON mode");
    }
  }
  for (const char* field : {"tools", "functions"}) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null() || (it->is_array() && it->empty())) continue;
    return unsupported(field, "no tool or function calling");
  }
  for (const char* field : {"tool_choice", "function_call"}) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null() || (it->is_string() && *it == "none")) continue;
    return unsupported(field, "no tool or function calling");
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& body, ParsedRequest* r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Bad("prompt", "'prompt' is required");
  if (it->is_string()) {
    r->prompt = it->get<std::string>();
  } else if (it->is_array()) {
    if (it->empty()) return Bad("prompt", "'prompt' must not be an empty array");
    if ((*it)[0].is_string()) {
      if (it->size() != 1 || !(*it)[0].is_string()) {
        return Bad("prompt", "only one prompt per request is supported (n=1, no batches)");
      }
      r->prompt = (*it)[0].get<std::string>();
    } else {
      for (const json& t : *it) {
        if (!t.is_number_integer()) {
          return Bad("prompt", "'prompt' must be a string, [string] or an array of token ids");
        }
        const int64_t id =
            t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX ? -1 : t.get<int64_t>();
        if (id < 0 || id > INT32_MAX) return Bad("prompt", "token id out of range: " + t.dump());
        r->prompt_tokens.push_back(static_cast<int32_t>(id));
      }
      r->prompt_is_tokens = true;
    }
  } else {
    return Bad("prompt", WrongType("prompt", "a string or an array", *it));
  }
  if (!r->prompt_is_tokens && r->prompt.empty()) return Bad("prompt", "'prompt' is empty");
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, const ParserLimits& limits,
                                      ParsedRequest* r) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Bad("messages", "'messages' is required");
  if (!it->is_array()) return Bad("messages", WrongType("messages", "an array", *it));
  if (it->empty()) return Bad("messages", "'messages' must not be empty");
  if (it->size() > limits.max_messages) {
    return Bad("messages", "at most " + std::to_string(limits.max_messages) + " messages");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(param, WrongType(param, "an object", m));
    ChatMessage message;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad(param + ".role", "'" + param + ".role' must be a string");
    }
    message.role = role->get<std::string>();
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      return Bad(param + ".role",
                 "role must be 'system', 'user' or 'assistant', not '" + message.role + "'");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return Bad(param + ".content", "'" + param + ".content' is required");
    }
    if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      // [{"type":"text","text":"…"}, …]: text parts only.
      for (const json& part : *content) {
        auto type = part.is_object() ? part.find("type") : part.end();
        auto text = part.is_object() ? part.find("text") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() ||
            type->get<std::string>() != "text" || text == part.end() || !text->is_string()) {
          return Bad(param + ".content", "only text content parts are supported");
        }
        message.content += text->get<std::string>();
      }
    } else {
      return Bad(param + ".content",
                 WrongType(param + ".content", "a string or an array", *content));
    }
    r->messages.push_back(std::move(message));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& body, const ParserLimits& limits, ParsedRequest* r) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) r->stop.push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (!it->is_array()) return Bad("stop", WrongType("stop", "a string or an array", *it));
  if (it->size() > limits.max_stop_strings) {
    return Bad("stop", "at most " + std::to_string(limits.max_stop_strings) + " stop strings");
  }
  for (const json& s : *it) {
    if (!s.is_string()) return Bad("stop", "'stop' must hold strings");
    if (!s.get<std::string>().empty()) r->stop.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

#define TESSERA_API_TRY(expr)                 \
  do {                                        \
    if (auto error_ = (expr)) return *error_; \
  } while (0)

ApiResult<ParsedRequest> ParseObject(Endpoint endpoint, const json& body,
                                     const ParserLimits& limits) {
  ParsedRequest r;
  r.endpoint = endpoint;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", WrongType("model", "a string", *it));
    r.model = it->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    TESSERA_API_TRY(ParsePrompt(body, &r));
  } else {
    TESSERA_API_TRY(ParseMessages(body, limits, &r));
  }
  std::optional<int64_t> n;
  TESSERA_API_TRY(GetInt(body, "n", INT64_MIN, INT64_MAX, &n));
  if (n && *n != 1) return Bad("n", "only n=1 is supported");
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) {
      return Bad("best_of", "only best_of=1 is supported");
    }
  }
  TESSERA_API_TRY(GetInt(body, "max_tokens", 1, limits.max_tokens_limit, &r.max_tokens));
  if (endpoint == Endpoint::kChatCompletions) {
    std::optional<int64_t> mct;
    TESSERA_API_TRY(GetInt(body, "max_completion_tokens", 1, limits.max_tokens_limit, &mct));
    if (mct) r.max_tokens = mct;
  }
  TESSERA_API_TRY(GetNumber(body, "temperature", 0, 2, false, &r.temperature));
  TESSERA_API_TRY(GetNumber(body, "top_p", 0, 1, true, &r.top_p));
  TESSERA_API_TRY(GetNumber(body, "min_p", 0, 1, false, &r.min_p));
  TESSERA_API_TRY(GetNumber(body, "repetition_penalty", 0, 10, true, &r.repetition_penalty));
  TESSERA_API_TRY(GetNumber(body, "presence_penalty", -2, 2, false, &r.presence_penalty));
  TESSERA_API_TRY(GetNumber(body, "frequency_penalty", -2, 2, false, &r.frequency_penalty));
  TESSERA_API_TRY(ParseLogitBias(body, limits, &r));
  TESSERA_API_TRY(RefuseUnsupported(body));
  std::optional<int64_t> top_k;
  TESSERA_API_TRY(GetInt(body, "top_k", -1, INT32_MAX, &top_k));
  if (top_k) r.top_k = static_cast<int32_t>(*top_k < 0 ? 0 : *top_k);
  std::optional<int64_t> seed;
  TESSERA_API_TRY(GetInt(body, "seed", INT64_MIN, INT64_MAX, &seed));
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  TESSERA_API_TRY(ParseStop(body, limits, &r));
  TESSERA_API_TRY(GetBool(body, "stream", &r.stream));
  TESSERA_API_TRY(GetBool(body, "ignore_eos", &r.ignore_eos));
  TESSERA_API_TRY(GetBool(body, "return_timing", &r.return_timing));
  std::optional<int64_t> spec_tokens;
  TESSERA_API_TRY(GetInt(body, "spec_tokens", 0, engine::kMaxSpecTokens, &spec_tokens));
  if (spec_tokens) r.spec_tokens = static_cast<int32_t>(*spec_tokens);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return Bad("stream_options", WrongType("stream_options", "an object", *it));
    if (!r.stream) return Bad("stream_options", "'stream_options' needs 'stream': true");
    if (auto iu = it->find("include_usage"); iu != it->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        return Bad("stream_options.include_usage",
                   WrongType("stream_options.include_usage", "a boolean", *iu));
      }
      r.include_usage = iu->get<bool>();
    }
  }
  if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string()) {
    return Bad("user", WrongType("user", "a string", *it));
  }
  if (endpoint == Endpoint::kCompletions) {
    TESSERA_API_TRY(GetBool(body, "echo", &r.echo));
    if (r.echo && r.prompt_is_tokens) {
      return Bad("echo", "'echo' needs a text prompt");
    }
    std::optional<int64_t> logprobs;
    TESSERA_API_TRY(GetInt(body, "logprobs", 0, limits.max_logprobs, &logprobs));
    if (logprobs) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int32_t>(*logprobs);
    }
  } else {
    TESSERA_API_TRY(GetBool(body, "logprobs", &r.logprobs));
    std::optional<int64_t> top;
    TESSERA_API_TRY(GetInt(body, "top_logprobs", 0, limits.max_logprobs, &top));
    if (top) {
      if (!r.logprobs) return Bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      r.top_logprobs = static_cast<int32_t>(*top);
    }
  }
  return r;
}

}  // namespace

std::string ApiError::ToJson() const {
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool IsValidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

ApiResult<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                      const ParserLimits& limits) {
  if (body.size() > limits.max_body_bytes) {
    ApiError error = Bad("", "the request body is " + std::to_string(body.size()) +
                                 " bytes; the limit is " + std::to_string(limits.max_body_bytes));
    error.http_status = 413;
    return error;
  }
  if (!IsValidUtf8(body)) return Bad("", "the request body is not valid UTF-8");
  if (!NestingWithin(body, kMaxJsonDepth)) {
    return Bad("", "the request body nests deeper than " + std::to_string(kMaxJsonDepth));
  }
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Bad("", "the request body is not valid JSON");
  if (!parsed.is_object()) return Bad("", "the request body must be a JSON object");
  try {
    return ParseObject(endpoint, parsed, limits);
  } catch (const json::exception& e) {  // a conversion the checks above missed
    return Bad("", std::string("malformed request: ") + e.what());
  }
}

}  // namespace tessera::serve
