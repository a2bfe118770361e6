// Named knobs read from the environment, with defaults. Layer: base. Every knob
// tessera reads is listed with its default and meaning in docs/knobs.md; read a
// knob once where the owning object is built and pass the value down.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace tessera {

std::optional<std::string> EnvString(const char* name);
std::string EnvStringOr(const char* name, std::string_view fallback);
// A decimal integer with an optional k/M/G suffix (powers of 1024), or `fallback`
// when unset. A malformed value is InvalidArgument naming the variable and the
// value (a user error that must not be silently ignored).
Result<int64_t> EnvIntOr(const char* name, int64_t fallback);
// 1/true/yes/on or 0/false/no/off/empty, or `fallback` when unset; anything else
// is InvalidArgument naming the variable.
Result<bool> EnvBoolOr(const char* name, bool fallback);

// Parses "256M", "4k", "17" into bytes; nullopt when malformed.
std::optional<int64_t> ParseSizeBytes(std::string_view text);

}  // namespace tessera
