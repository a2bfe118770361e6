// PrefetchLines: the software prefetch the kernels share. Layer: kernels (internal).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// Pulls the cache lines of [p, p + bytes) into L1 (prefetcht0 on x86): a hint,
// results never depend on it.
inline void PrefetchLines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t line = 0; line < bytes; line += 64) {
    __builtin_prefetch(c + line, /*rw=*/0, /*locality=*/3);
  }
}

}  // namespace tessera::kernels
