// printf-style logging with format checking, prefixed with the process's rank
// label and the subsystem: "[r1 comm] I connected to rank 0 (127.0.0.1:29500)".
// Layer: base. Thread-safe (one write(2) per line). Never inside per-token loops.
// Level from TESSERA_LOG_LEVEL (debug|info|warn|error, default warn).
#pragma once

#include <string_view>

namespace tessera {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Set once at process start (e.g. by the launcher) so every line names its rank.
void SetLogRankLabel(std::string_view label);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

void LogF(LogLevel level, const char* subsystem, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace tessera

#define TESSERA_LOG(level, subsystem, ...)                                       \
  do {                                                                           \
    if (::tessera::LogEnabled(::tessera::LogLevel::level))                       \
      ::tessera::LogF(::tessera::LogLevel::level, subsystem, __VA_ARGS__);       \
  } while (0)
#define TLOG_DEBUG(subsystem, ...) TESSERA_LOG(kDebug, subsystem, __VA_ARGS__)
#define TLOG_INFO(subsystem, ...) TESSERA_LOG(kInfo, subsystem, __VA_ARGS__)
#define TLOG_WARN(subsystem, ...) TESSERA_LOG(kWarn, subsystem, __VA_ARGS__)
#define TLOG_ERROR(subsystem, ...) TESSERA_LOG(kError, subsystem, __VA_ARGS__)
