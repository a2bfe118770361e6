// What the per-target matmul files (matmul_hwy.cc, matmul_float_hwy.cc) share for
// each Highway target: TESSERA_MATMUL_X86 (AVX2 or better: the intrinsics paths),
// TESSERA_UNROLL, and the K-chunk tree (matmul.h) over 8-lane f32 vectors of
// partials, lane-wise. Include after highway.h (Highway's per-target include guard).
#if defined(TESSERA_KERNELS_MATMUL_TARGET_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_KERNELS_MATMUL_TARGET_INL_H_
#undef TESSERA_KERNELS_MATMUL_TARGET_INL_H_
#else
#define TESSERA_KERNELS_MATMUL_TARGET_INL_H_
#endif

#include "hwy/highway.h"

#undef TESSERA_MATMUL_X86
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TESSERA_MATMUL_X86 1
#else
#define TESSERA_MATMUL_X86 0
#endif

#ifndef TESSERA_UNROLL
#define TESSERA_UNROLL _Pragma("GCC unroll 16")
#endif

#if TESSERA_MATMUL_X86
#include <immintrin.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {

// The canonical tree over c[lo, hi), lane-wise.
inline __m256 TreeSumLanesRecursive(const __m256* c, int lo, int hi) {
  if (hi - lo == 1) return c[lo];
  const int mid = lo + (hi - lo) / 2;
  return _mm256_add_ps(TreeSumLanesRecursive(c, lo, mid), TreeSumLanesRecursive(c, mid, hi));
}

// The same over c[0, n), power-of-two counts unrolled.
HWY_INLINE __m256 TreeSumLanes(const __m256* c, int n) {
  switch (n) {
    case 1:
      return c[0];
    case 2:
      return _mm256_add_ps(c[0], c[1]);
    case 4:
      return _mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3]));
    case 8:
      return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3])),
                           _mm256_add_ps(_mm256_add_ps(c[4], c[5]), _mm256_add_ps(c[6], c[7])));
    default:
      return TreeSumLanesRecursive(c, 0, n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_MATMUL_X86
#endif  // per-target include guard
