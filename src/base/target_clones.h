// TESSERA_TARGET_CLONES(targets…): GCC/clang function multi-versioning, one copy of
// the function per target and an ifunc that the dynamic loader resolves to the best
// the CPU runs. Layer: base.
// Off under ThreadSanitizer: the ifunc resolver is instrumented and runs while the
// loader relocates the binary, before the TSan runtime is up, and crashed every
// TSan test binary at start-up (GCC 12). Those builds take the baseline copy.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TESSERA_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TESSERA_TSAN_BUILD 1
#endif
#endif

#if defined(TESSERA_TSAN_BUILD)
#define TESSERA_TARGET_CLONES(...)
#else
#define TESSERA_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif
