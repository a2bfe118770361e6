#include "base/env.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace tessera {

std::optional<std::string> EnvString(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string EnvStringOr(const char* name, std::string_view fallback) {
  auto value = EnvString(name);
  return value ? *value : std::string(fallback);
}

std::optional<int64_t> ParseSizeBytes(std::string_view text) {
  if (text.empty()) return std::nullopt;
  int64_t multiplier = 1;
  char last = text.back();
  if (last == 'k' || last == 'K') multiplier = int64_t{1} << 10;
  if (last == 'm' || last == 'M') multiplier = int64_t{1} << 20;
  if (last == 'g' || last == 'G') multiplier = int64_t{1} << 30;
  if (multiplier != 1) text.remove_suffix(1);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  if (value != 0 && (value * multiplier) / multiplier != value) return std::nullopt;
  return value * multiplier;
}

Result<int64_t> EnvIntOr(const char* name, int64_t fallback) {
  auto value = EnvString(name);
  if (!value) return fallback;
  auto parsed = ParseSizeBytes(*value);
  if (!parsed) {
    return InvalidArgumentError("environment variable " + std::string(name) + "='" + *value +
                                "' is not an integer (a number with an optional k, M or G)");
  }
  return *parsed;
}

Result<bool> EnvBoolOr(const char* name, bool fallback) {
  auto value = EnvString(name);
  if (!value) return fallback;
  const std::string& v = *value;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  return InvalidArgumentError("environment variable " + std::string(name) + "='" + v +
                              "' is not a boolean (1/true/yes/on or 0/false/no/off)");
}

}  // namespace tessera
