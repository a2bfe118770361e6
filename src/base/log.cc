#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace tessera {
namespace {

LogLevel LevelFromEnv() {
  const char* value = std::getenv("TESSERA_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kWarn;
  if (std::strcmp(value, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(value, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(value, "error") == 0) return LogLevel::kError;
  return LogLevel::kWarn;
}

// Logging configuration is the one process-wide state in base: it describes the
// process (its rank), not any object inside it.
struct LogState {
  std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  std::mutex label_mutex;
  std::string rank_label;
};

LogState& State() {
  static LogState state;
  return state;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarn: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

void SetLogRankLabel(std::string_view label) {
  std::lock_guard lock(State().label_mutex);
  State().rank_label = std::string(label);
}

void SetLogLevel(LogLevel level) { State().level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= State().level.load(); }

void LogF(LogLevel level, const char* subsystem, const char* format, ...) {
  char line[2048];
  std::string label;
  {
    std::lock_guard lock(State().label_mutex);
    label = State().rank_label;
  }
  int prefix = std::snprintf(line, sizeof(line), "[%s%s%s] %c ", label.c_str(),
                             label.empty() ? "" : " ", subsystem, LevelLetter(level));
  if (prefix < 0) return;
  va_list args;
  va_start(args, format);
  int body = std::vsnprintf(line + prefix, sizeof(line) - prefix - 1, format, args);
  va_end(args);
  size_t length = static_cast<size_t>(prefix) + (body < 0 ? 0 : static_cast<size_t>(body));
  if (length > sizeof(line) - 2) length = sizeof(line) - 2;
  line[length++] = '\n';
  ssize_t ignored = ::write(STDERR_FILENO, line, length);
  (void)ignored;
}

}  // namespace tessera
