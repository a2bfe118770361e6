#include "base/proc_status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace tessera {

int64_t ProcStatusBytes(std::string_view field) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen("/proc/self/status", "r"),
                                                    &std::fclose);
  if (!f) return 0;
  char line[256];
  while (std::fgets(line, sizeof line, f.get()) != nullptr) {
    // "VmHWM:\t  123456 kB"
    const std::string_view text(line);
    if (!text.starts_with(field) || text.size() <= field.size() || text[field.size()] != ':') {
      continue;
    }
    return std::strtoll(line + field.size() + 1, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace tessera
