// Per-target MatMul row kernels for the K-quants, Q4_K and Q6_K (compiled once per
// Highway target by foreach_target; see matmul.h for the order-of-summation contract;
// the shared tile walk is in matmul_quant_target-inl.h). Per output and 32-element
// sub-block, the exact integer dot S and two f32 FMAs (Q4_K: scale and min) or one
// (Q6_K). x86 (AVX2, AVX-512 VNNI) runs raw intrinsics: 8 rows × up to 4 tokens in
// the lanes of a vector (16 rows on AVX-512 VNNI; the rows interleaved at load, or
// gathered from the GGUF rows); other targets compute one output at a time in scalar
// code: the same bits everywhere.
#include <algorithm>
#include <cmath>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_kquant_x86.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "base/check.h"
#include "base/half.h"
#include "kernels/matmul_internal.h"
#include "kernels/matmul_quant_target-inl.h"
#include "kernels/matmul_target-inl.h"
#include "kernels/prefetch.h"
#include "kernels/quantize.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
#if TESSERA_MATMUL_VNNI
#pragma GCC target("avx512vnni")
#endif
namespace tessera::kernels {
namespace HWY_NAMESPACE {

// ([[maybe_unused]]: some targets' code does not use them, and clang warns there.)
// A K-quant GEMV over rows longer than this prefetches its own two groups' super-block
// kKQuantAheadSupers on instead of the next pair's (Q4KPairTile, Q6KPairTile).
constexpr int64_t kKQuantNextTileMaxCols = 2048;
[[maybe_unused]] constexpr int64_t kKQuantAheadSupers = 2;

// What a Q4_K/Q6_K tile of tokens [t0, …) prefetches at each super-block: the next
// tile's (its first tile of a decode-sized batch), its own kKQuantAheadSupers on (a
// GEMV over long rows), or nothing. Every K-quant tile, AVX2 and AVX-512, asks here.
enum class KQuantFetch { kNone, kNextTile, kOwnAhead };
inline KQuantFetch KQuantFetchFor(const MatMulArgs& a, int64_t t0) {
  if (a.n_tokens == 1 && a.w.cols > kKQuantNextTileMaxCols) return KQuantFetch::kOwnAhead;
  if (t0 == 0 && a.n_tokens <= kStreamTokens) return KQuantFetch::kNextTile;
  return KQuantFetch::kNone;
}

// ------------------------------------------------------------------------ Q4_K
// Per output and 32-element sub-block j of a K chunk, in order (matmul.h):
//   acc  = fma(float(S_j), (d·sc_j)·d_x, acc),  S_j = Σ nibble·q8 (exact)
//   macc = fma(dmin·m_j, d_x·Σx, macc)
// and the chunk's partial is acc − macc. Both sums are exact integers and every
// float product is rounded once, so every target, tile and layout gives these bits.

#if TESSERA_MATMUL_X86

// The K-chunk and super-block loop of the 8-row Q4_K tiles: rows [r0, r0 + rows)
// (rows <= 8) × tokens [t0, t0 + T), one f32 lane per row. super(b) starts
// super-block b; scales(b, s, scale, min) gives the 8 rows' d·sc_s and dmin·m_s (lane
// = row) when sub-block s is reached (all 8 held from the start overflow AVX2's 16
// registers: the AVX2 GEMV took 0.86–0.88× the time this way, batches the same);
// dots(b, p, lo, hi) the exact sub-block dots S of sub-blocks 2p and 2p + 1 per token.
template <int T, class SuperFn, class ScalesFn, class DotsFn>
HWY_INLINE void Q4KEightRows(const MatMulArgs& a, int64_t r0, int rows, int64_t t0, SuperFn&& super,
                             ScalesFn&& scales, DotsFn&& dots) {
  const TokenRows<T> act(*a.xq, t0);
  const int64_t supers_per_chunk = a.chunk_elems / 256;
  __m256 partial[T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m256 acc[T], macc[T];
    TESSERA_UNROLL for (int t = 0; t < T; ++t) acc[t] = macc[t] = _mm256_setzero_ps();
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      super(b);
      TESSERA_UNROLL for (int p = 0; p < 4; ++p) {
        __m256i lo[T], hi[T];
        dots(b, p, act, lo, hi);
        TESSERA_UNROLL for (int h = 0; h < 2; ++h) {
          const int s = 2 * p + h;
          const int64_t j = b * 8 + s;
          __m256 scale, min;
          scales(b, s, scale, min);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            const __m256i sum = h == 0 ? lo[t] : hi[t];
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                     _mm256_mul_ps(scale, _mm256_set1_ps(act.d[t][j])), acc[t]);
            macc[t] = _mm256_fmadd_ps(min, _mm256_set1_ps(act.sum_d[t][j]), macc[t]);
          }
        }
      }
    }
    TESSERA_UNROLL for (int t = 0; t < T; ++t) partial[t][c] = _mm256_sub_ps(acc[t], macc[t]);
  }
  StoreTree8<T>(a, partial, r0, rows, t0);
}

// Q4_K in the kInterleaved8 layout, one group × T tokens. Chunk c of pair p holds 4
// quant bytes of each row (lane = row): the low nibbles times the token's 4
// activations of sub-block 2p broadcast to every lane, the high ones times those of
// 2p + 1, summed vertically into each row's exact S (vpdpbusd; or maddubs, 8 of them
// adding up in int16 as in Q4_0, |lane| <= 8 · 2 · 15 · 127, and one madd).
template <int T>
void Q4KInterleavedTile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  const uint8_t* group = a.w.data + r0 * a.w.row_bytes;
  const uint8_t* next_group = group + 8 * a.w.row_bytes;
  // A decode-sized batch's first tile reads its group from memory: fetch the next
  // group's super-block at the pace this one is read (as EightRowBlocks); a GEMV over
  // long rows its own, ahead (as Q4KPairTile). Zen 5 running this AVX2 code
  // (TESSERA_BENCH_TARGET=AVX2, 3 alternating rounds), 2048x5632 one core / two:
  // Q4_K 19.8-28.2 / 34.9-45.1 -> 20.3-26.7 / 40.9-44.8 GB/s, Q6_K 15.7-21.7 /
  // 34.7-39.7 -> 22.0-23.8 / 39.6-42.7.
  const KQuantFetch fetch = KQuantFetchFor(a, t0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 d, dmin;  // the current super-block's
  Q4KEightRows<T>(
      a, r0, 8, t0,
      [&](int64_t b) {
        const uint8_t* g = group + b * kQ4KGroupSuperBytes;
        if (fetch != KQuantFetch::kNone) {
          const uint8_t* ahead = fetch == KQuantFetch::kNextTile
                                     ? next_group + b * kQ4KGroupSuperBytes
                                     : g + kKQuantAheadSupers * kQ4KGroupSuperBytes;
          PrefetchLines(ahead, kQ4KGroupSuperBytes);
        }
        d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + kQ4KGroupD)));
        dmin =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + kQ4KGroupDMin)));
      },
      [&](int64_t b, int s, __m256& scale, __m256& min) {
        const uint8_t* g = group + b * kQ4KGroupSuperBytes;
        const auto bytes8 = [&](int64_t offset) {  // 8 u8 as f32 lanes
          return _mm256_cvtepi32_ps(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g + offset))));
        };
        scale = _mm256_mul_ps(d, bytes8(kQ4KGroupScales + 8 * s));
        min = _mm256_mul_ps(dmin, bytes8(kQ4KGroupMins + 8 * s));
      },
      [&](int64_t b, int p, const TokenRows<T>& act, __m256i(&lo)[T], __m256i(&hi)[T]) {
        const uint8_t* quants = group + b * kQ4KGroupSuperBytes + kQ4KGroupQuants + 256 * p;
        const auto x4 = [&](int t, int e) {  // activations e..e+3 of pair p, every lane
          int32_t v;
          std::memcpy(&v, act.qs[t] + b * 256 + 64 * p + e, 4);
          return _mm256_set1_epi32(v);
        };
#if TESSERA_MATMUL_VNNI
        TESSERA_UNROLL for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm256_setzero_si256();
        TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 32 * k));
          const __m256i ql = _mm256_and_si256(v, low4);
          const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            lo[t] = _mm256_dpbusd_epi32(lo[t], ql, x4(t, 4 * k));
            hi[t] = _mm256_dpbusd_epi32(hi[t], qh, x4(t, 32 + 4 * k));
          }
        }
#else
        __m256i lo16[T], hi16[T];
        TESSERA_UNROLL for (int t = 0; t < T; ++t) lo16[t] = hi16[t] = _mm256_setzero_si256();
        TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 32 * k));
          const __m256i ql = _mm256_and_si256(v, low4);
          const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(ql, x4(t, 4 * k)));
            hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(qh, x4(t, 32 + 4 * k)));
          }
        }
        const __m256i ones16 = _mm256_set1_epi16(1);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          lo[t] = _mm256_madd_epi16(lo16[t], ones16);
          hi[t] = _mm256_madd_epi16(hi16[t], ones16);
        }
#endif
      });
}

// Q4_K in the GGUF row layout, 8 rows × T tokens: each row's sub-block dot in 8
// int32 lanes, summed across lanes into one vector of 8 exact S (LaneSums8); the
// scales decoded per row. Missing rows repeat the last one and are not stored.
template <int T>
void Q4KRowTile(const MatMulArgs& a, int64_t r0, int rows, int64_t t0) {
  constexpr int64_t kSuperBytes = BlockBytes(WeightType::kQ4_K);
  const uint8_t* wrow[8];
  for (int r = 0; r < 8; ++r) wrow[r] = a.w.data + (r0 + std::min(r, rows - 1)) * a.w.row_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  HWY_ALIGN float sc[8][8], mn[8][8];  // the current super-block's, [s][row]
  Q4KEightRows<T>(
      a, r0, rows, t0,
      [&](int64_t b) {
        for (int r = 0; r < 8; ++r) {
          const uint8_t* sb = wrow[r] + b * kSuperBytes;
          const float d = F16ToF32(U16At(sb)), dmin = F16ToF32(U16At(sb + 2));
          for (int s = 0; s < 8; ++s) {
            uint8_t q_sc, q_m;
            Q4KScaleMin(s, sb + kQ4KScalesOffset, &q_sc, &q_m);
            sc[s][r] = d * static_cast<float>(q_sc);
            mn[s][r] = dmin * static_cast<float>(q_m);
          }
        }
      },
      [&](int64_t, int s, __m256& scale, __m256& min) {
        scale = _mm256_load_ps(sc[s]);
        min = _mm256_load_ps(mn[s]);
      },
      [&](int64_t b, int p, const TokenRows<T>& act, __m256i(&lo)[T], __m256i(&hi)[T]) {
        __m256i ql[8], qh[8];
        for (int r = 0; r < 8; ++r) {
          const __m256i v = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(wrow[r] + b * kSuperBytes + kQ4KQsOffset + 32 * p));
          ql[r] = _mm256_and_si256(v, low4);
          qh[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        const __m256i ones16 = _mm256_set1_epi16(1);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          const int8_t* x = act.qs[t] + b * 256 + 64 * p;
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
          __m256i dl[8], dh[8];
          for (int r = 0; r < 8; ++r) {
            dl[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(ql[r], xl), ones16);
            dh[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(qh[r], xh), ones16);
          }
          lo[t] = LaneSums8(dl);
          hi[t] = LaneSums8(dh);
        }
      });
}

#if TESSERA_MATMUL_VNNI

// Q4_K in the kInterleaved8 layout, a pair of groups (16 rows) × T tokens in 16-lane
// vectors, lanes 0–7 the first group's rows and 8–15 the second's:
// Q4KInterleavedTile's sub-block dots and FMAs per lane, so the same bits, at twice
// the width. A sub-block's scales are widened when it is reached. One thread,
// kernels_bench against Q4KInterleavedTile (alternating, 2 rounds): 512 tokens
// 0.55–0.62× the time, 64 tokens 0.57–0.65×, 4 tokens 0.73–0.95×, GEMV 0.83–1.0×;
// a GEMV of 2 or 4 pairs at once (4 or 8 streams) took 1.1–1.5× the time of one.
template <int T>
void Q4KPairTile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  const int64_t group_bytes = 8 * a.w.row_bytes;
  const uint8_t* first = a.w.data + r0 * a.w.row_bytes;
  const TokenRows<T> act(*a.xq, t0);
  const int64_t supers_per_chunk = a.chunk_elems / 256;
  // A decode-sized batch's first tile (a GEMV's every tile) fetches the next tile's
  // super-block at the pace it reads its own (as EightRowBlocks); a GEMV over rows
  // longer than kKQuantNextTileMaxCols fetches its own groups' instead,
  // kKQuantAheadSupers ahead (as the Q8_0 GEMV its next block). kernels_bench, one
  // Zen 5 core / two, 2 alternating rounds, GB/s: 2048x5632 Q4_K 26.6-27.7 / 41.3-44.4
  // -> 29.0-29.9 / 47.8-49.1, Q6_K 22.4-26.8 / 39.7-40.8 -> 28.6-29.3 / 48.0-50.0;
  // over 2048 columns the next tile's stays ahead (5632x2048 Q4_K 27.8-29.3 /
  // 48.8-53.5 against 21.1-22.0 / 36.0-39.3 with the own ones).
  const KQuantFetch fetch = KQuantFetchFor(a, t0);
  if (a.k_chunks < 1 || a.k_chunks > kMaxKChunks) __builtin_unreachable();  // MatMul checked
  const auto both = [&](const uint8_t* sb, int64_t offset) {
    return PairBytes32(sb + offset, group_bytes);
  };
  const auto bytes = [&](const uint8_t* sb, int64_t offset) {  // as f32
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(PairBytes8(sb + offset, group_bytes)));
  };
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 partial[T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m512 acc[T], macc[T];
    TESSERA_UNROLL for (int t = 0; t < T; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      const uint8_t* sb = first + b * kQ4KGroupSuperBytes;  // the first group's
      if (fetch != KQuantFetch::kNone) {  // the next pair's super-block b, or ours on
        for (int g = 0; g < 2; ++g) {
          PrefetchLines(fetch == KQuantFetch::kNextTile
                            ? sb + (g + 2) * group_bytes
                            : sb + g * group_bytes + kKQuantAheadSupers * kQ4KGroupSuperBytes,
                        kQ4KGroupSuperBytes);
        }
      }
      const __m512 d = PairHalfs(sb + kQ4KGroupD, group_bytes);
      const __m512 dmin = PairHalfs(sb + kQ4KGroupDMin, group_bytes);
      TESSERA_UNROLL for (int q = 0; q < 4; ++q) {  // sub-blocks 2q and 2q + 1
        __m512i lo[T], hi[T];
        TESSERA_UNROLL for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
        TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
          const __m512i v = both(sb, kQ4KGroupQuants + 256 * q + 32 * k);
          const __m512i ql = _mm512_and_si512(v, low4);
          const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            int32_t xl, xh;  // activations 4k.. of sub-block 2q and of 2q + 1
            std::memcpy(&xl, act.qs[t] + b * 256 + 64 * q + 4 * k, 4);
            std::memcpy(&xh, act.qs[t] + b * 256 + 64 * q + 32 + 4 * k, 4);
            lo[t] = _mm512_dpbusd_epi32(lo[t], ql, _mm512_set1_epi32(xl));
            hi[t] = _mm512_dpbusd_epi32(hi[t], qh, _mm512_set1_epi32(xh));
          }
        }
        TESSERA_UNROLL for (int h = 0; h < 2; ++h) {
          const int s = 2 * q + h;
          const int64_t j = b * 8 + s;
          const __m512 scale = _mm512_mul_ps(d, bytes(sb, kQ4KGroupScales + 8 * s));
          const __m512 min = _mm512_mul_ps(dmin, bytes(sb, kQ4KGroupMins + 8 * s));
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h == 0 ? lo[t] : hi[t]),
                                     _mm512_mul_ps(scale, _mm512_set1_ps(act.d[t][j])), acc[t]);
            macc[t] = _mm512_fmadd_ps(min, _mm512_set1_ps(act.sum_d[t][j]), macc[t]);
          }
        }
      }
    }
    TESSERA_UNROLL for (int t = 0; t < T; ++t) partial[t][c] = _mm512_sub_ps(acc[t], macc[t]);
  }
  TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + r0, TreeSumLanes(partial[t], a.k_chunks));
  }
}

#endif  // TESSERA_MATMUL_VNNI

#else  // !TESSERA_MATMUL_X86

// One output y[t, r] in the contract's order (GGUF rows).
inline void Q4KOne(const MatMulArgs& a, int64_t r, int64_t t) {
  const Q8Activations& xq = *a.xq;
  const int64_t nb = xq.cols / 32, supers_per_chunk = a.chunk_elems / 256;
  const int8_t* xrow = xq.qs.data() + t * xq.cols;
  const float* xd = xq.d.data() + t * nb;
  const float* xsd = xq.sum_d.data() + t * nb;
  float partial[kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    float acc = 0.0f, macc = 0.0f;
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      const uint8_t* sb = a.w.data + r * a.w.row_bytes + b * BlockBytes(WeightType::kQ4_K);
      const float d = F16ToF32(U16At(sb)), dmin = F16ToF32(U16At(sb + 2));
      for (int s = 0; s < 8; ++s) {
        const int64_t j = b * 8 + s;
        const uint8_t* q = sb + kQ4KQsOffset + 32 * (s / 2);
        const int8_t* x = xrow + j * 32;
        int32_t sum = 0;
        for (int e = 0; e < 32; ++e) sum += ((s & 1) ? q[e] >> 4 : q[e] & 0xF) * x[e];
        uint8_t sc, m;
        Q4KScaleMin(s, sb + kQ4KScalesOffset, &sc, &m);
        const float scale = d * static_cast<float>(sc);
        const float min = dmin * static_cast<float>(m);
        acc = std::fma(static_cast<float>(sum), scale * xd[j], acc);
        macc = std::fma(min, xsd[j], macc);
      }
    }
    partial[c] = acc - macc;
  }
  a.y[t * a.y_stride + r] = TreeSum(partial, 0, a.k_chunks);
}

void Q4KRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  OneOutputAtATime(a, row_begin, row_end, Q4KOne);
}

#endif  // TESSERA_MATMUL_X86

// ------------------------------------------------------------------------ Q6_K
// Per output and 32-element sub-block j of a K chunk, in order (matmul.h):
//   acc = fma(float(S_j), d·d_x, acc),  S_j = sc_a·Σ(q − 32)·x + sc_b·Σ(q − 32)·x
// over its two halves of 16 (exact integers, |S_j| < 2^25), the chunk's partial
// acc: the same bits on every target, tile and layout.

#if TESSERA_MATMUL_X86

// Q6_K sub-block s's 32 signed weights, and in *mult the int16 multipliers of its
// two halves of 16.
HWY_INLINE __m256i DecodeBlockX86(const uint8_t* sb, int s, const int8_t* q6_scale, __m256i* mult) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int h = s / 4, k = s % 4;
  const __m256i ql =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + h * 64 + (k & 1) * 32));
  const __m256i qh =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ6KQhOffset + h * 32));
  const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, low4);
  const __m256i hi = _mm256_slli_epi16(
      _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3)), 4);
  *mult = _mm256_set_m128i(_mm_set1_epi16(q6_scale[h * 8 + 2 * k + 1]),
                           _mm_set1_epi16(q6_scale[h * 8 + 2 * k]));
  return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

HWY_INLINE float F16Bits(const uint8_t* p) { return _cvtsh_ss(U16At(p)); }

// Σx over each 16 q8 activations of super-block b (sums[t][g] for elements
// [16g, 16g + 16)), for the −32 of every 6-bit quant: psadbw of x + 128.
template <int T>
HWY_INLINE void Q6KHalfSums(const TokenRows<T>& act, int64_t b, int32_t (&sums)[T][16]) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    for (int s = 0; s < 8; ++s) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.qs[t] + b * 256 + 32 * s));
      HWY_ALIGN int64_t quarter[4];  // Σ(x + 128) over 8 bytes each
      _mm256_store_si256(reinterpret_cast<__m256i*>(quarter),
                         _mm256_sad_epu8(_mm256_xor_si256(x, flip), _mm256_setzero_si256()));
      sums[t][2 * s] = static_cast<int32_t>(quarter[0] + quarter[1]) - 16 * 128;
      sums[t][2 * s + 1] = static_cast<int32_t>(quarter[2] + quarter[3]) - 16 * 128;
    }
  }
}

// The K-chunk and super-block loop of the 8-row Q6_K tiles: rows [r0, r0 + rows)
// (rows <= 8) × tokens [t0, t0 + T), one f32 lane per row. super(b) returns the 8
// rows' d (lane = row); sub(b, s, act, half_sums, S) gives per token the 8 rows'
// exact S of sub-block s (half_sums: Q6KHalfSums, when half_sums_needed).
template <int T, class SuperFn, class SubFn>
HWY_INLINE void Q6KEightRows(const MatMulArgs& a, int64_t r0, int rows, int64_t t0, SuperFn&& super,
                             SubFn&& sub, bool half_sums_needed = true) {
  const TokenRows<T> act(*a.xq, t0);
  const int64_t supers_per_chunk = a.chunk_elems / 256;
  __m256 partial[T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m256 acc[T];
    TESSERA_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      const __m256 d = super(b);
      int32_t half_sums[T][16];
      if (half_sums_needed) Q6KHalfSums<T>(act, b, half_sums);
      TESSERA_UNROLL for (int s = 0; s < 8; ++s) {
        const int64_t j = b * 8 + s;
        __m256i sum[T];
        sub(b, s, act, half_sums, sum);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]),
                                   _mm256_mul_ps(d, _mm256_set1_ps(act.d[t][j])), acc[t]);
        }
      }
    }
    TESSERA_UNROLL for (int t = 0; t < T; ++t) partial[t][c] = acc[t];
  }
  StoreTree8<T>(a, partial, r0, rows, t0);
}

// The 6-bit quants of sub-block s = 4n + k, elements 4c..4c+3 of each of 8 rows
// (lane = row, unsigned 0..63), from the interleaved (n, c) chunk's ql bytes (QLA
// for k = 0, 2; QLB for k = 1, 3; low nibbles for k < 2) and qh bytes (bits 2k, 2k+1).
HWY_INLINE __m256i Q6KQuants(__m256i ql, __m256i qh, int k) {
  const __m256i low =
      _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_and_si256(k == 3   ? _mm256_srli_epi16(qh, 2)
                                        : k == 2 ? qh
                                                 : _mm256_slli_epi16(qh, 4 - 2 * k),
                                        _mm256_set1_epi8(0x30));
  return _mm256_or_si256(low, high);
}

// Q6_K in the kInterleaved8 layout, one group × T tokens: per sub-block, each half's
// Σ q·x (vpdpbusd, or maddubs + madd: |pair| <= 2 · 63 · 127), less 32·Σx, times
// the rows' scale of that half (int32 multiply), summed: each row's exact S.
template <int T>
void Q6KInterleavedTile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  const uint8_t* group = a.w.data + r0 * a.w.row_bytes;
  const uint8_t* next_group = group + 8 * a.w.row_bytes;
  const KQuantFetch fetch = KQuantFetchFor(a, t0);  // as Q4KInterleavedTile
  Q6KEightRows<T>(
      a, r0, 8, t0,
      [&](int64_t b) {
        if (fetch != KQuantFetch::kNone) {
          const uint8_t* ahead = fetch == KQuantFetch::kNextTile
                                     ? next_group + b * kQ6KGroupSuperBytes
                                     : group + (b + kKQuantAheadSupers) * kQ6KGroupSuperBytes;
          PrefetchLines(ahead, kQ6KGroupSuperBytes);
        }
        return _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(group + b * kQ6KGroupSuperBytes + kQ6KGroupD)));
      },
      [&](int64_t b, int s, const TokenRows<T>& act, const int32_t(&half_sums)[T][16],
          __m256i(&sum)[T]) {
        const uint8_t* sb = group + b * kQ6KGroupSuperBytes;
        const int n = s / 4, k = s % 4;
        const uint8_t* chunks = sb + kQ6KGroupQuants + 768 * n;
        __m256i dot[2][T];
        TESSERA_UNROLL for (int h = 0; h < 2; ++h) TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          dot[h][t] = _mm256_setzero_si256();
        }
        const auto quants = [&](int c) {  // chunk c's quants of sub-block s
          const uint8_t* chunk = chunks + 96 * c;
          return Q6KQuants(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * (k & 1))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64)), k);
        };
        const auto x4 = [&](int t, int c) {  // the token's 4 activations of chunk c
          int32_t v;
          std::memcpy(&v, act.qs[t] + b * 256 + 32 * s + 4 * c, 4);
          return _mm256_set1_epi32(v);
        };
#if TESSERA_MATMUL_VNNI
        TESSERA_UNROLL for (int c = 0; c < 8; ++c) {
          const __m256i q = quants(c);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            dot[c / 4][t] = _mm256_dpbusd_epi32(dot[c / 4][t], q, x4(t, c));
          }
        }
#else
        // Two chunks' maddubs add up in int16 (|each lane| <= 2 · 63 · 127, two:
        // 32004), then one madd widens them.
        TESSERA_UNROLL for (int c = 0; c < 8; c += 2) {
          const __m256i q0 = quants(c), q1 = quants(c + 1);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(q0, x4(t, c)),
                                                   _mm256_maddubs_epi16(q1, x4(t, c + 1)));
            dot[c / 4][t] =
                _mm256_add_epi32(dot[c / 4][t], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
          }
        }
#endif
        const auto scales = [&](int g) {  // the 8 rows' int8 scale of half g, as int32
          return _mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + kQ6KGroupScales + 8 * g)));
        };
        const __m256i sc_a = scales(2 * s), sc_b = scales(2 * s + 1);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          const __m256i da =
              _mm256_sub_epi32(dot[0][t], _mm256_set1_epi32(32 * half_sums[t][2 * s]));
          const __m256i db =
              _mm256_sub_epi32(dot[1][t], _mm256_set1_epi32(32 * half_sums[t][2 * s + 1]));
          sum[t] = _mm256_add_epi32(_mm256_mullo_epi32(sc_a, da), _mm256_mullo_epi32(sc_b, db));
        }
      });
}

// Q6_K in the GGUF row layout, 8 rows × T tokens: each row's sub-block dot with its
// two half scales (maddubs of |w| and sign(x, w), madd by the scales) in 8 int32
// lanes, summed across lanes into one vector of 8 exact S (LaneSums8). Missing rows
// repeat the last one and are not stored.
template <int T>
void Q6KRowTile(const MatMulArgs& a, int64_t r0, int rows, int64_t t0) {
  constexpr int64_t kSuperBytes = BlockBytes(WeightType::kQ6_K);
  const uint8_t* wrow[8];
  for (int r = 0; r < 8; ++r) wrow[r] = a.w.data + (r0 + std::min(r, rows - 1)) * a.w.row_bytes;
  Q6KEightRows<T>(
      a, r0, rows, t0,
      [&](int64_t b) {
        HWY_ALIGN float d[8];
        for (int r = 0; r < 8; ++r) d[r] = F16Bits(wrow[r] + b * kSuperBytes + kQ6KDOffset);
        return _mm256_load_ps(d);
      },
      [&](int64_t b, int s, const TokenRows<T>& act, const int32_t(&)[T][16], __m256i(&sum)[T]) {
        __m256i x[T];
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          x[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.qs[t] + b * 256 + 32 * s));
        }
        __m256i lanes[T][8];
        TESSERA_UNROLL for (int r = 0; r < 8; ++r) {
          const uint8_t* sb = wrow[r] + b * kSuperBytes;
          __m256i mult;
          const __m256i w =
              DecodeBlockX86(sb, s, reinterpret_cast<const int8_t*>(sb + kQ6KScalesOffset), &mult);
          const __m256i aw = _mm256_sign_epi8(w, w);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            lanes[t][r] =
                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[t], w)), mult);
          }
        }
        TESSERA_UNROLL for (int t = 0; t < T; ++t) sum[t] = LaneSums8(lanes[t]);
      },
      /*half_sums_needed=*/false);
}

#if TESSERA_MATMUL_VNNI

// Q6_K in the kInterleaved8 layout, a pair of groups (16 rows) × T tokens in 16-lane
// vectors (lanes 0–7 the first group's rows, 8–15 the second's): the same exact S
// and FMA per lane as Q6KInterleavedTile, so the same bits, at twice the width.
template <int T>
void Q6KPairTile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  const int64_t group_bytes = 8 * a.w.row_bytes;
  const uint8_t* first = a.w.data + r0 * a.w.row_bytes;
  const TokenRows<T> act(*a.xq, t0);
  const int64_t supers_per_chunk = a.chunk_elems / 256;
  // As Q4KPairTile.
  const KQuantFetch fetch = KQuantFetchFor(a, t0);
  if (a.k_chunks < 1 || a.k_chunks > kMaxKChunks) __builtin_unreachable();  // MatMul checked
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  __m512 partial[T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m512 acc[T];
    TESSERA_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      const uint8_t* sb = first + b * kQ6KGroupSuperBytes;  // the first group's
      if (fetch != KQuantFetch::kNone) {  // the next pair's super-block b, or ours on
        for (int g = 0; g < 2; ++g) {
          PrefetchLines(fetch == KQuantFetch::kNextTile
                            ? sb + (g + 2) * group_bytes
                            : sb + g * group_bytes + kKQuantAheadSupers * kQ6KGroupSuperBytes,
                        kQ6KGroupSuperBytes);
        }
      }
      const __m512 d = PairHalfs(sb + kQ6KGroupD, group_bytes);
      int32_t half_sums[T][16];
      Q6KHalfSums<T>(act, b, half_sums);
      TESSERA_UNROLL for (int s = 0; s < 8; ++s) {
        const int n = s / 4, k = s % 4;
        const int64_t j = b * 8 + s;
        __m512i dot[2][T];
        TESSERA_UNROLL for (int h = 0; h < 2; ++h) TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          dot[h][t] = _mm512_setzero_si512();
        }
        TESSERA_UNROLL for (int ci = 0; ci < 8; ++ci) {
          const uint8_t* chunk = sb + kQ6KGroupQuants + 768 * n + 96 * ci;
          const __m512i ql = PairBytes32(chunk + 32 * (k & 1), group_bytes);
          const __m512i qh = PairBytes32(chunk + 64, group_bytes);
          const __m512i low = _mm512_and_si512(k >= 2 ? _mm512_srli_epi16(ql, 4) : ql, low4);
          const __m512i high = _mm512_and_si512(k == 3   ? _mm512_srli_epi16(qh, 2)
                                                : k == 2 ? qh
                                                         : _mm512_slli_epi16(qh, 4 - 2 * k),
                                                bits45);
          const __m512i q = _mm512_or_si512(low, high);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            int32_t v;
            std::memcpy(&v, act.qs[t] + b * 256 + 32 * s + 4 * ci, 4);
            dot[ci / 4][t] = _mm512_dpbusd_epi32(dot[ci / 4][t], q, _mm512_set1_epi32(v));
          }
        }
        const auto scales = [&](int g) {  // both groups' int8 scale of half g, as int32
          return _mm512_cvtepi8_epi32(PairBytes8(sb + kQ6KGroupScales + 8 * g, group_bytes));
        };
        const __m512i sc_a = scales(2 * s), sc_b = scales(2 * s + 1);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          const __m512i da =
              _mm512_sub_epi32(dot[0][t], _mm512_set1_epi32(32 * half_sums[t][2 * s]));
          const __m512i db =
              _mm512_sub_epi32(dot[1][t], _mm512_set1_epi32(32 * half_sums[t][2 * s + 1]));
          const __m512i sum =
              _mm512_add_epi32(_mm512_mullo_epi32(sc_a, da), _mm512_mullo_epi32(sc_b, db));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                   _mm512_mul_ps(d, _mm512_set1_ps(act.d[t][j])), acc[t]);
        }
      }
    }
    TESSERA_UNROLL for (int t = 0; t < T; ++t) partial[t][c] = acc[t];
  }
  TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + r0, TreeSumLanes(partial[t], a.k_chunks));
  }
}

#endif  // TESSERA_MATMUL_VNNI

// A K-quant's tiles for KQuantRows.
template <WeightType kType>
struct KQuantTiles {
  static constexpr bool kQ4K = kType == WeightType::kQ4_K;
  template <int T>
  static void Group(const MatMulArgs& a, int64_t r, int64_t t0) {
    kQ4K ? Q4KInterleavedTile<T>(a, r, t0) : Q6KInterleavedTile<T>(a, r, t0);
  }
#if TESSERA_MATMUL_VNNI
  template <int T>
  static void Pair(const MatMulArgs& a, int64_t r, int64_t t0) {
    kQ4K ? Q4KPairTile<T>(a, r, t0) : Q6KPairTile<T>(a, r, t0);
  }
#endif
  template <int T>
  static void Rows(const MatMulArgs& a, int64_t r, int rows, int64_t t0) {
    kQ4K ? Q4KRowTile<T>(a, r, rows, t0) : Q6KRowTile<T>(a, r, rows, t0);
  }
};

// A K-quant's rows: interleaved, in pairs of groups on AVX-512 VNNI (an odd last
// group alone) or in groups; in the GGUF layout, in 8-row tiles.
template <class Tiles>
void KQuantRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.w.layout == WeightLayout::kInterleaved8) {
#if TESSERA_MATMUL_VNNI
    EightRowTiles<16>(a, row_begin, row_end, [&](auto tokens, int64_t r, int rows, int64_t t0) {
      constexpr int T = decltype(tokens)::value;
      if (rows == 16) return Tiles::template Pair<T>(a, r, t0);
      Tiles::template Group<T>(a, r, t0);
    });
#else
    EightRowTiles(a, row_begin, row_end,
                  [&](auto tokens, int64_t r, int /*rows: always 8*/, int64_t t0) {
                    Tiles::template Group<decltype(tokens)::value>(a, r, t0);
                  });
#endif
    return;
  }
  EightRowTiles(a, row_begin, row_end, [&](auto tokens, int64_t r, int rows, int64_t t0) {
    Tiles::template Rows<decltype(tokens)::value>(a, r, rows, t0);
  });
}

void Q4KRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  KQuantRows<KQuantTiles<WeightType::kQ4_K>>(a, row_begin, row_end);
}
void Q6KRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  KQuantRows<KQuantTiles<WeightType::kQ6_K>>(a, row_begin, row_end);
}

#else  // !TESSERA_MATMUL_X86

// One output y[t, r] in the contract's order (GGUF rows: within each half of the
// super-block, elements l, l + 32, l + 64, l + 96 share qh[l] and ql[l] / ql[l + 32]).
inline void Q6KOne(const MatMulArgs& a, int64_t r, int64_t t) {
  const Q8Activations& xq = *a.xq;
  const int64_t nb = xq.cols / 32, supers_per_chunk = a.chunk_elems / 256;
  const int8_t* xrow = xq.qs.data() + t * xq.cols;
  const float* xd = xq.d.data() + t * nb;
  float partial[kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    float acc = 0.0f;
    for (int64_t b = c * supers_per_chunk; b < (c + 1) * supers_per_chunk; ++b) {
      const uint8_t* sb = a.w.data + r * a.w.row_bytes + b * BlockBytes(WeightType::kQ6_K);
      const float d = F16ToF32(U16At(sb + kQ6KDOffset));
      for (int s = 0; s < 8; ++s) {
        const int64_t j = b * 8 + s;
        const int n = s / 4, k = s % 4;
        int32_t sum = 0;
        for (int h = 0; h < 2; ++h) {
          int32_t half = 0;
          for (int l = 16 * h; l < 16 * h + 16; ++l) {
            const uint8_t ql = sb[64 * n + 32 * (k & 1) + l], qh = sb[kQ6KQhOffset + 32 * n + l];
            const int q = ((k >= 2 ? ql >> 4 : ql) & 0xF) | (((qh >> (2 * k)) & 3) << 4);
            half += (q - 32) * xrow[j * 32 + l];
          }
          sum += static_cast<int8_t>(sb[kQ6KScalesOffset + 2 * s + h]) * half;
        }
        acc = std::fma(static_cast<float>(sum), d * xd[j], acc);
      }
    }
    partial[c] = acc;
  }
  a.y[t * a.y_stride + r] = TreeSum(partial, 0, a.k_chunks);
}

void Q6KRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  OneOutputAtATime(a, row_begin, row_end, Q6KOne);
}

#endif  // TESSERA_MATMUL_X86

// Rows [row_begin, row_end) of a Q4_K or Q6_K matrix, either layout.
void MatMulKQuantRowsImpl(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.w.type == WeightType::kQ4_K) return Q4KRows(a, row_begin, row_end);
  if (a.w.type == WeightType::kQ6_K) return Q6KRows(a, row_begin, row_end);
  TESSERA_CHECK(false) << "MatMulKQuantRows takes Q4_K and Q6_K, not " << TraitsOf(a.w.type).name;
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {

HWY_EXPORT(MatMulKQuantRowsImpl);

void MatMulKQuantRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulKQuantRowsImpl)(args, row_begin, row_end);
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
