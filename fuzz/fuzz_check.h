// What the fuzz targets share: Require, an invariant that crashes with its text
// and line when broken (libFuzzer keeps the input), and Size, a size from the
// input. Fuzz targets only.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#define Require(ok)                                                             \
  do {                                                                          \
    if (!(ok)) {                                                                \
      std::fprintf(stderr, "invariant failed at line %d: %s\n", __LINE__, #ok); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

namespace tessera::fuzz {

// A size in [1, max] from the input; `max` once the input is used up (fast).
inline size_t Size(FuzzedDataProvider& fdp, size_t max) {
  return fdp.remaining_bytes() == 0 ? max : fdp.ConsumeIntegralInRange<size_t>(1, max);
}

}  // namespace tessera::fuzz
