// Named knobs read from the environment, with defaults. Layer: base. Every knob
// tessera reads is listed with its default and meaning in docs/knobs.md; read a
// knob once where the owning object is built and pass the value down.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

std::optional<std::string> EnvString(const char* name);
std::string EnvStringOr(const char* name, std::string_view fallback);
// Parses a decimal integer with an optional k/M/G suffix (powers of 1024).
// A malformed value aborts with a message naming the variable (a user error
// that must not be silently ignored).
int64_t EnvIntOr(const char* name, int64_t fallback);
bool EnvBoolOr(const char* name, bool fallback);

// Parses "256M", "4k", "17" into bytes; nullopt when malformed.
std::optional<int64_t> ParseSizeBytes(std::string_view text);

}  // namespace tessera
