#include "base/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

#if defined(__x86_64__)
bool HasF16c() {
#if defined(__clang__)  // clang 14 does not know "f16c" here; every AVX2 CPU has it
  static const bool has = __builtin_cpu_supports("avx2");
#else
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
#endif
  return has;
}

__attribute__((target("avx2,f16c"))) void F16ToF32RowF16c(const uint16_t* in, float* out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}

__attribute__((target("avx2,f16c"))) void F32ToF16RowF16c(const float* in, uint16_t* out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = F32ToF16(in[i]);
}
#endif

}  // namespace

void F16ToF32Row(const uint16_t* in, float* out, size_t n) {
#if defined(__x86_64__)
  if (HasF16c()) return F16ToF32RowF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(in[i]);
}

void F32ToF16Row(const float* in, uint16_t* out, size_t n) {
#if defined(__x86_64__)
  if (HasF16c()) return F32ToF16RowF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = F32ToF16(in[i]);
}

}  // namespace tessera
