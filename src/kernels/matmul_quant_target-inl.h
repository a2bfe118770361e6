// What the quantised matmul files (matmul_block_scaled_x86.cc: Q8_0/Q4_0,
// matmul_kquant_x86.cc: Q4_K/Q6_K) share for each Highway target: block sizes, the
// portable one-output-at-a-time loop, and on x86 the q8 activations of a token tile,
// the walk over token blocks, row blocks and tiles, the lane-wise stores and sums, and
// (AVX-512 VNNI) the loads of a pair of interleaved groups. Layer: kernels (internal).
// Include after highway.h (Highway's per-target include guard).
#if defined(TESSERA_KERNELS_MATMUL_QUANT_TARGET_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_KERNELS_MATMUL_QUANT_TARGET_INL_H_
#undef TESSERA_KERNELS_MATMUL_QUANT_TARGET_INL_H_
#else
#define TESSERA_KERNELS_MATMUL_QUANT_TARGET_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hwy/highway.h"
// After highway.h:
#include "kernels/matmul_internal.h"
#include "kernels/matmul_target-inl.h"

#if TESSERA_MATMUL_X86
#include <immintrin.h>
#endif

// The quantised kernels' files compile for AVX3_DL with the EVEX vpdpbusd; so do these
// helpers, so that the kernels' lambdas still inline into them.
HWY_BEFORE_NAMESPACE();
#if TESSERA_MATMUL_VNNI
#pragma GCC target("avx512vnni")
#endif
namespace tessera::kernels {
namespace HWY_NAMESPACE {

// ([[maybe_unused]]: some targets' code does not use them, and clang warns there.)
// Rows whose weights stay in L2 across token tiles.
[[maybe_unused]] constexpr int64_t kRowBlock = 32;
constexpr int64_t kStreamTokens = 16;  // batches up to this prefetch their rows

constexpr int64_t BlockBytes(WeightType type) {
  switch (type) {
    case WeightType::kQ8_0:
      return 34;
    case WeightType::kQ4_0:
      return 18;
    case WeightType::kQ4_K:
      return 144;
    default:
      return 210;  // Q6_K
  }
}

inline uint16_t U16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

#if !TESSERA_MATMUL_X86
// Rows [row_begin, row_end), one output at a time: one(args, r, t) computes y[t, r] in
// the contract's order from the GGUF rows. An interleaved matrix's rows are read back
// into that layout first (GgufRow, once a row), so the scalar code knows one layout.
template <class OneFn>
void OneOutputAtATime(const MatMulArgs& a, int64_t row_begin, int64_t row_end, OneFn&& one) {
  if (a.w.layout == WeightLayout::kRows) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t t = 0; t < a.n_tokens; ++t) one(a, r, t);
    }
    return;
  }
  const int64_t row_bytes = *RowBytes(a.w.type, a.w.cols);
  std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
  MatMulArgs single = a;  // one row, in the GGUF layout, written at y + r
  single.w = {.type = a.w.type,
              .data = row.data(),
              .rows = 1,
              .cols = a.w.cols,
              .row_bytes = row_bytes,
              .layout = WeightLayout::kRows};
  for (int64_t r = row_begin; r < row_end; ++r) {
    GgufRow(a.w, r, row.data());
    single.y = a.y + r;
    for (int64_t t = 0; t < a.n_tokens; ++t) one(single, 0, t);
  }
}
#endif  // !TESSERA_MATMUL_X86

#if TESSERA_MATMUL_X86

// Lane r of the result = Σ of p[r]'s eight lanes (int32; exact for one block).
HWY_INLINE __m256i LaneSums8(const __m256i* p) {
  const __m256i t0 = _mm256_hadd_epi32(p[0], p[1]), t1 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i t2 = _mm256_hadd_epi32(p[4], p[5]), t3 = _mm256_hadd_epi32(p[6], p[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

constexpr int kBlockScaledTokenTile = 4;  // tokens per tile (T ≤ 4)
// A prefill's q8 activations are walked in blocks of about this many quant bytes
// (whole tiles; their scales and sums add 3/8), so that a block stays in L2 while
// the row blocks go by.
constexpr int64_t kActivationBlockBytes = int64_t{128} << 10;

// The q8 activations of tokens [t0, t0 + T): each token's quants, block scales and
// block sums.
template <int T>
struct TokenRows {
  const int8_t* qs[T];
  const float* d[T];
  const int32_t* sum[T];
  const float* sum_d[T];
  TokenRows(const Q8Activations& xq, int64_t t0) {
    const int64_t nb = xq.cols / 32;
    TESSERA_UNROLL for (int t = 0; t < T; ++t) {
      qs[t] = xq.qs.data() + (t0 + t) * xq.cols;
      d[t] = xq.d.data() + (t0 + t) * nb;
      sum[t] = xq.sum_q.data() + (t0 + t) * nb;
      sum_d[t] = xq.sum_d.data() + (t0 + t) * nb;
    }
  }
};

// Token blocks of about kActivationBlockBytes of q8 activations (kept in L2 while
// the row blocks go by), row blocks of kRowBlock rows (their weights kept in L2
// across the block's token tiles), token tiles of up to 4, kTileRows rows at a time (8;
// 16 for the pair tiles, the last tile of a row block 8 when its rows are odd groups):
// tile(std::integral_constant<int, T>, first row, rows (<= kTileRows), first token).
template <int kTileRows = 8, class TileFn>
void EightRowTiles(const MatMulArgs& a, int64_t row_begin, int64_t row_end, TileFn&& tile) {
  // A decode-sized batch is one block: its first token tile streams the rows from
  // memory and the later ones find them in L2 (BlockScaledTile's `stream`).
  const int64_t token_block =
      a.n_tokens <= kStreamTokens
          ? a.n_tokens
          : std::max<int64_t>(
                kBlockScaledTokenTile,
                kActivationBlockBytes / a.xq->cols / kBlockScaledTokenTile * kBlockScaledTokenTile);
  for (int64_t tb = 0; tb < a.n_tokens; tb += token_block) {
    const int64_t tb_end = std::min(a.n_tokens, tb + token_block);
    for (int64_t rb = row_begin; rb < row_end; rb += kRowBlock) {
      const int64_t re = std::min(row_end, rb + kRowBlock);
      for (int64_t t0 = tb; t0 < tb_end; t0 += kBlockScaledTokenTile) {
        const int64_t tokens = std::min<int64_t>(kBlockScaledTokenTile, tb_end - t0);
        for (int64_t r = rb; r < re; r += kTileRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kTileRows, re - r));
          switch (tokens) {
            case 1:
              tile(std::integral_constant<int, 1>{}, r, rows, t0);
              break;
            case 2:
              tile(std::integral_constant<int, 2>{}, r, rows, t0);
              break;
            case 3:
              tile(std::integral_constant<int, 3>{}, r, rows, t0);
              break;
            default:
              tile(std::integral_constant<int, 4>{}, r, rows, t0);
              break;
          }
        }
      }
    }
  }
}

// y of rows [r0, r0 + rows) (rows <= 8, lane = row) × tokens [t0, t0 + T): each
// token's K-chunk partials combined by the chunk tree, lane by lane.
template <int T>
HWY_INLINE void StoreTree8(const MatMulArgs& a, const __m256 (&partial)[T][kMaxKChunks], int64_t r0,
                           int rows, int64_t t0) {
  TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    const __m256 sum = TreeSumLanes(partial[t], a.k_chunks);
    float* y = a.y + (t0 + t) * a.y_stride + r0;
    if (rows == 8) {
      _mm256_storeu_ps(y, sum);
    } else {
      HWY_ALIGN float lanes[8];
      _mm256_store_ps(lanes, sum);
      std::memcpy(y, lanes, rows * sizeof(float));
    }
  }
}

#if TESSERA_MATMUL_VNNI

// Loads for a pair of interleaved groups `group_bytes` apart, the first group's bytes
// at p: lanes 0–7 (or bytes 0–31) from the first, 8–15 (32–63) from the second.
HWY_INLINE __m512i PairBytes32(const uint8_t* p, int64_t group_bytes) {  // 32 bytes each
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + group_bytes)), 1);
}
HWY_INLINE __m512 PairHalfs(const uint8_t* p, int64_t group_bytes) {  // 8 f16 each, as f32
  return _mm512_cvtph_ps(_mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + group_bytes)), 1));
}
HWY_INLINE __m128i PairBytes8(const uint8_t* p, int64_t group_bytes) {  // 8 bytes each
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + group_bytes)));
}

#endif  // TESSERA_MATMUL_VNNI

#endif  // TESSERA_MATMUL_X86

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
