// Per-target quantisation of a matmul's activations to q8 blocks of 32 (compiled
// once per Highway target by foreach_target; layout and rounding in matmul.h), for
// every quantised weight type's kernels (matmul_block_scaled_x86.cc,
// matmul_kquant_x86.cc). x86 (AVX2 and better) runs raw intrinsics, other targets
// scalar code; both round half to even, so every target gives the same q8.
#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_q8_activations_x86.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "kernels/matmul_internal.h"
#include "kernels/matmul_target-inl.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {

// q8 activations of tokens [t_begin, t_end) (layout and rounding in matmul.h;
// cvtps2dq and nearbyint both round half to even, so every target agrees).
void QuantizeQ8RowsImpl(const float* x, int64_t x_stride, int64_t t_begin, int64_t t_end,
                        Q8Activations* out) {
  const int64_t cols = out->cols, nb = cols / 32;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* xt = x + t * x_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * 32;
      int8_t* q = out->qs.data() + t * cols + b * 32;
#if TESSERA_MATMUL_X86
      const __m256 sign_mask = _mm256_set1_ps(-0.0f);
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
      }
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      m = _mm_max_ss(m, _mm_movehdup_ps(m));
      const float d = _mm_cvtss_f32(m) / 127.0f;
      const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      __m256i qi[4];
      for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
      // Pack 4×8 int32 -> 32 int8 in order (packs work per 128-bit lane; fix with a permute).
      const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]);
      const __m256i p16b = _mm256_packs_epi32(qi[2], qi[3]);
      const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      const __m256i ordered =
          _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
      // Σq via maddubs with ones (exact).
      const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), ordered);
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      const int sum = _mm_cvtsi128_si32(s);
#else
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[j] * id), -127.0f, 127.0f));
        sum += q[j];
      }
#endif
      out->d[t * nb + b] = d;
      out->sum_q[t * nb + b] = sum;
      out->sum_d[t * nb + b] = d * static_cast<float>(sum);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {

HWY_EXPORT(QuantizeQ8RowsImpl);

void QuantizeQ8Rows(const float* x, int64_t x_stride, int64_t t_begin, int64_t t_end,
                    Q8Activations* out) {
  HWY_DYNAMIC_DISPATCH(QuantizeQ8RowsImpl)(x, x_stride, t_begin, t_end, out);
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
