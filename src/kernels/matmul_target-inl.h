// What the per-target matmul files (matmul_float_hwy.cc, matmul_block_scaled_x86.cc,
// matmul_kquant_x86.cc, matmul_q8_activations_x86.cc) share for each Highway target:
// TESSERA_MATMUL_X86 (AVX2 or better: the intrinsics paths), TESSERA_MATMUL_AVX512
// (AVX-512: the 16-lane paths), TESSERA_MATMUL_VNNI, TESSERA_UNROLL, and the K-chunk
// tree (matmul.h) over 8-lane f32 vectors of partials, lane-wise. Include after
// highway.h (Highway's per-target include guard).
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
// AVX-512 (F, VL, DQ, BW): 16-lane paths where they pay.
#undef TESSERA_MATMUL_AVX512
#if TESSERA_MATMUL_X86 && HWY_TARGET <= HWY_AVX3
#define TESSERA_MATMUL_AVX512 1
#else
#define TESSERA_MATMUL_AVX512 0
#endif
// AVX512-VNNI (vpdpbusd): Highway's AVX3_DL runs only where CPUID shows it (its
// target string names only the VEX form, so the files add the EVEX one); GCC only.
#undef TESSERA_MATMUL_VNNI
#if TESSERA_MATMUL_AVX512 && HWY_TARGET == HWY_AVX3_DL && defined(__GNUC__) && !defined(__clang__)
#define TESSERA_MATMUL_VNNI 1
#else
#define TESSERA_MATMUL_VNNI 0
#endif

#ifndef TESSERA_UNROLL
#define TESSERA_UNROLL _Pragma("GCC unroll 16")
#endif

#if TESSERA_MATMUL_X86
#include <immintrin.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {

HWY_INLINE __m256 AddLanes(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
#if TESSERA_MATMUL_AVX512
HWY_INLINE __m512 AddLanes(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
#endif

// The canonical tree over c[lo, hi), lane-wise.
template <class V>
V TreeSumLanesRecursive(const V* c, int lo, int hi) {
  if (hi - lo == 1) return c[lo];
  const int mid = lo + (hi - lo) / 2;
  return AddLanes(TreeSumLanesRecursive(c, lo, mid), TreeSumLanesRecursive(c, mid, hi));
}

// The same over c[0, n), power-of-two counts unrolled.
template <class V>
HWY_INLINE V TreeSumLanes(const V* c, int n) {
  switch (n) {
    case 1:
      return c[0];
    case 2:
      return AddLanes(c[0], c[1]);
    case 4:
      return AddLanes(AddLanes(c[0], c[1]), AddLanes(c[2], c[3]));
    case 8:
      return AddLanes(AddLanes(AddLanes(c[0], c[1]), AddLanes(c[2], c[3])),
                      AddLanes(AddLanes(c[4], c[5]), AddLanes(c[6], c[7])));
    default:
      return TreeSumLanesRecursive(c, 0, n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_MATMUL_X86
#endif  // per-target include guard
