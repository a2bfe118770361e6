// Per-target MatMul row kernels for the block-scaled weights, Q8_0 and Q4_0 (compiled
// once per Highway target by foreach_target; see matmul.h for the order-of-summation
// contract; the shared tile walk is in matmul_quant_target-inl.h). Per output, per
// 32-element block, the exact integer dot S of the weights with the q8 activations,
// then one f32 FMA
//   acc = fma(float(S), d_w · d_x, acc)
// in block order within each K chunk. The integer dot is exact however it is summed,
// so every target and tile shape gives the same bits. x86 (AVX2, AVX-512 VNNI) runs
// raw intrinsics: 8 rows × up to 4 tokens in the lanes of a vector, 16 rows on VNNI,
// the GGUF row layout and the kInterleaved8 one; other targets compute one output at
// a time in scalar code.
#include <algorithm>
#include <cmath>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_block_scaled_x86.cc"
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
// A Q8_0 GEMV over rows this short prefetches.
[[maybe_unused]] constexpr int64_t kShortRowCols = 1024;

// ------------------------------------------------ Q8_0 / Q4_0 (block-scaled)

constexpr bool IsBlockScaled(WeightType type) {
  return type == WeightType::kQ8_0 || type == WeightType::kQ4_0;
}

// Exact integer dot of one weight block with 32 q8 activations.
template <WeightType kType>
int32_t BlockDotScalar(const uint8_t* block, const int8_t* x) {
  int32_t sum = 0;
  if constexpr (kType == WeightType::kQ8_0) {
    const int8_t* w = reinterpret_cast<const int8_t*>(block + 2);
    for (int e = 0; e < 32; ++e) sum += w[e] * x[e];
  } else {
    for (int e = 0; e < 16; ++e) {
      sum += ((block[2 + e] & 0xF) - 8) * x[e];
      sum += ((block[2 + e] >> 4) - 8) * x[e + 16];
    }
  }
  return sum;
}

// One output y[t, r] in the contract's order (the reference for the tiles below).
template <WeightType kType>
void BlockScaledOne(const MatMulArgs& a, int64_t r, int64_t t) {
  constexpr int64_t kBlockBytes = BlockBytes(kType);
  const Q8Activations& xq = *a.xq;
  const int64_t nb = xq.cols / 32, blocks_per_chunk = a.chunk_elems / 32;
  const uint8_t* wrow = a.w.data + r * a.w.row_bytes;
  const int8_t* xrow = xq.qs.data() + t * xq.cols;
  const float* xd = xq.d.data() + t * nb;
  float partial[kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    float acc = 0.0f;
    for (int64_t j = c * blocks_per_chunk; j < (c + 1) * blocks_per_chunk; ++j) {
      const uint8_t* block = wrow + j * kBlockBytes;
      const float scale = F16ToF32(U16At(block)) * xd[j];
      acc = std::fma(static_cast<float>(BlockDotScalar<kType>(block, xrow + j * 32)), scale, acc);
    }
    partial[c] = acc;
  }
  a.y[t * a.y_stride + r] = TreeSum(partial, 0, a.k_chunks);
}

#if TESSERA_MATMUL_X86

// The f16 block scales of 8 rows' block at `offset`, as f32 lanes.
HWY_INLINE __m256 RowScales8(const uint8_t* const* wrow, int64_t offset) {
  return _mm256_cvtph_ps(_mm_setr_epi16(
      static_cast<int16_t>(U16At(wrow[0] + offset)), static_cast<int16_t>(U16At(wrow[1] + offset)),
      static_cast<int16_t>(U16At(wrow[2] + offset)), static_cast<int16_t>(U16At(wrow[3] + offset)),
      static_cast<int16_t>(U16At(wrow[4] + offset)), static_cast<int16_t>(U16At(wrow[5] + offset)),
      static_cast<int16_t>(U16At(wrow[6] + offset)),
      static_cast<int16_t>(U16At(wrow[7] + offset))));
}

// Q8_0: eight int32 lanes whose sum is the block's dot with x, as |w|·sign(x, w)
// (exact, also for w = -128).
HWY_INLINE __m256i Q8LaneDots(const uint8_t* block, __m256i x, __m256i ones16) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)),
                           ones16);
}

// Q4_0: the 16 int16 pair sums of unsigned nibbles times x (|each| ≤ 2·15·127;
// the low nibbles pair with x[0, 16), the high ones with x[16, 32); the caller
// subtracts 8·Σx).
HWY_INLINE __m256i Q4PairDots(const uint8_t* block, __m256i x) {
  const __m256i raw =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
  const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)),
                                     _mm256_set1_epi8(0x0F));
  return _mm256_maddubs_epi16(q, x);
}

// Lane r = Σ of p[r]'s 16 int16 lanes, for inputs small enough that sums of 8 of
// them fit int16 (Q4PairDots: 8 · 3810 < 32768): three levels of 16-bit hadds leave
// each row's two 128-bit halves side by side, widened and added last.
HWY_INLINE __m256i RowSums8Small(const __m256i* p) {
  const __m256i t0 = _mm256_hadd_epi16(p[0], p[1]), t1 = _mm256_hadd_epi16(p[2], p[3]);
  const __m256i t2 = _mm256_hadd_epi16(p[4], p[5]), t3 = _mm256_hadd_epi16(p[6], p[7]);
  const __m256i v = _mm256_hadd_epi16(_mm256_hadd_epi16(t0, t1), _mm256_hadd_epi16(t2, t3));
  return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                          _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)));
}

// The K-chunk and block loop of the 8-row block-scaled tiles: outputs of rows
// [r0, r0 + rows) (rows <= 8) × tokens [t0, t0 + T), one f32 lane per row, so the 8
// rows' block scales are one vector and no horizontal sum of floats is needed. Per
// block j, block(j, act, dw, dot) gives the 8 rows' scales and, per token, their
// exact integer block dots S; then acc = fma(float(S), d_w·d_x, acc). The rows of a
// tile lie 8 block widths per block apart from the next 8 rows (`next_rows`), in the
// row layout and the interleaved one alike.
template <WeightType kType, int T, class BlockFn>
HWY_INLINE void EightRowBlocks(const MatMulArgs& a, int64_t r0, int rows, int64_t t0,
                               const uint8_t* next_rows, BlockFn&& block) {
  constexpr int64_t kGroupBlock = 8 * BlockBytes(kType);
  const int64_t blocks_per_chunk = a.chunk_elems / 32;
  // The first token tile of a row block reads its rows from memory (later tiles of
  // a batch find them in L2): prefetch ahead there, for decode-sized batches; a
  // prefill's tiles compute long enough for the hardware prefetcher (measured:
  // prefetching there cost ~4% at 512 tokens, and saved ~16% at 8 tokens).
  const bool stream = t0 == 0 && a.n_tokens <= kStreamTokens;
  const TokenRows<T> act(*a.xq, t0);
  __m256 partial[T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m256 acc[T];
    TESSERA_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t j = c * blocks_per_chunk; j < (c + 1) * blocks_per_chunk; ++j) {
      if (stream) {
        // Streams of one row's length are too short for the hardware prefetcher:
        // fetch the next 8 rows' block at the pace these are read.
        const uint8_t* ahead = next_rows + j * kGroupBlock;
        PrefetchLines(ahead, kGroupBlock);
      }
      __m256 dw;
      __m256i dot[T];
      block(j, act, dw, dot);
      TESSERA_UNROLL for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]),
                                 _mm256_mul_ps(dw, _mm256_set1_ps(act.d[t][j])), acc[t]);
      }
    }
    TESSERA_UNROLL for (int t = 0; t < T; ++t) partial[t][c] = acc[t];
  }
  StoreTree8<T>(a, partial, r0, rows, t0);
}

// Q8_0 / Q4_0 in the GGUF row layout: per block, each row's dot with the token's 32
// activations, summed across lanes into one vector of 8 exact S. Missing rows
// repeat the last one and are not stored.
template <WeightType kType, int T>
void BlockScaledTile(const MatMulArgs& a, int64_t r0, int rows, int64_t t0) {
  constexpr int64_t kBlockBytes = BlockBytes(kType);
  const uint8_t* wrow[8];
  for (int r = 0; r < 8; ++r) wrow[r] = a.w.data + (r0 + std::min(r, rows - 1)) * a.w.row_bytes;
  const __m256i ones16 = _mm256_set1_epi16(1);
  EightRowBlocks<kType, T>(
      a, r0, rows, t0, wrow[0] + 8 * a.w.row_bytes,
      [&](int64_t j, const TokenRows<T>& act, __m256& dw, __m256i(&dot)[T]) {
        const int64_t offset = j * kBlockBytes;
        dw = RowScales8(wrow, offset);
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          const __m256i x =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.qs[t] + j * 32));
          if constexpr (kType == WeightType::kQ4_0) {
            __m256i pairs[8];
            TESSERA_UNROLL for (int r = 0; r < 8; ++r) pairs[r] = Q4PairDots(wrow[r] + offset, x);
            dot[t] = _mm256_sub_epi32(RowSums8Small(pairs), _mm256_set1_epi32(8 * act.sum[t][j]));
          } else {
            __m256i lanes[8];
            TESSERA_UNROLL for (int r = 0; r < 8; ++r) {
              lanes[r] = Q8LaneDots(wrow[r] + offset, x, ones16);
            }
            dot[t] = LaneSums8(lanes);
          }
        }
      });
}

template <WeightType kType>
void BlockScaledRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  EightRowTiles(a, row_begin, row_end, [&](auto tokens, int64_t r, int rows, int64_t t0) {
    BlockScaledTile<kType, decltype(tokens)::value>(a, r, rows, t0);
  });
}

// Q8_0 / Q4_0 in the kInterleaved8 layout (matmul.h): 8 rows × T tokens, one row
// per 32-bit lane. Chunk c of a block holds 4 quant bytes of each row; each is
// multiplied with the token's 4 matching activations broadcast to every lane, so
// lane r sums row r's products vertically and ends as its exact block dot S.
//  Q8_0: 8 chunks = elements 4c..4c+3; |w| · sign(x, w) by maddubs, widened per
//    chunk by madd (two chunks' int16 sums could overflow).
//  Q4_0: 4 chunks; the low nibbles are elements 4c..4c+3, the high ones
//    16+4c..16+4c+3. The eight maddubs of a block add up in int16 (|each lane| <=
//    2 · 15 · 127, eight: 30480) and one madd widens them: Σ q·x, less 8·Σx.
template <WeightType kType, int T>
void Interleaved8Tile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  constexpr int64_t kGroupBlock = 8 * BlockBytes(kType);
  const uint8_t* group = a.w.data + r0 * a.w.row_bytes;
  const __m256i ones16 = _mm256_set1_epi16(1);
  EightRowBlocks<kType, T>(
      a, r0, 8, t0, group + 8 * a.w.row_bytes,
      [&](int64_t j, const TokenRows<T>& act, __m256& dw, __m256i(&dot)[T]) {
        const uint8_t* block = group + j * kGroupBlock;
        dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
        const auto chunk = [&](int k) {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * k));
        };
        const auto x4 = [&](int t, int e) {  // activations e..e+3 of token t, every lane
          int32_t v;
          std::memcpy(&v, act.qs[t] + j * 32 + e, 4);
          return _mm256_set1_epi32(v);
        };
        if constexpr (kType == WeightType::kQ8_0) {
          TESSERA_UNROLL for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
#if TESSERA_MATMUL_VNNI
          // vpdpbusd multiplies unsigned by signed: Σ (x + 128)·w, less 128·Σw (the
          // row sums by one more vpdpbusd with ones, shared by the tokens). Exact.
          const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // x + 128 as u8
          __m256i w_sum = _mm256_setzero_si256();
          TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
            const __m256i w = chunk(k);
            w_sum = _mm256_dpbusd_epi32(w_sum, _mm256_set1_epi8(1), w);
            TESSERA_UNROLL for (int t = 0; t < T; ++t) {
              dot[t] = _mm256_dpbusd_epi32(dot[t], _mm256_xor_si256(x4(t, 4 * k), flip), w);
            }
          }
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            dot[t] = _mm256_sub_epi32(dot[t], _mm256_slli_epi32(w_sum, 7));
          }
#else
          TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
            const __m256i w = chunk(k), aw = _mm256_abs_epi8(w);
            TESSERA_UNROLL for (int t = 0; t < T; ++t) {
              const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x4(t, 4 * k), w));
              dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(p, ones16));
            }
          }
#endif
        } else {
          const __m256i low4 = _mm256_set1_epi8(0x0F);
          __m256i q[8];
          TESSERA_UNROLL for (int k = 0; k < 4; ++k) {
            const __m256i v = chunk(k);
            q[2 * k] = _mm256_and_si256(v, low4);
            q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          }
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
#if TESSERA_MATMUL_VNNI
            // The nibbles are the unsigned operand of vpdpbusd as they are.
            __m256i sum = _mm256_set1_epi32(-8 * act.sum[t][j]);
            TESSERA_UNROLL for (int k = 0; k < 4; ++k) {
              sum = _mm256_dpbusd_epi32(sum, q[2 * k], x4(t, 4 * k));
              sum = _mm256_dpbusd_epi32(sum, q[2 * k + 1], x4(t, 16 + 4 * k));
            }
            dot[t] = sum;
#else
            __m256i sum = _mm256_setzero_si256();
            TESSERA_UNROLL for (int k = 0; k < 4; ++k) {
              sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(q[2 * k], x4(t, 4 * k)));
              sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(q[2 * k + 1], x4(t, 16 + 4 * k)));
            }
            dot[t] = _mm256_sub_epi32(_mm256_madd_epi16(sum, ones16),
                                      _mm256_set1_epi32(8 * act.sum[t][j]));
#endif
          }
        }
      });
}

#if TESSERA_MATMUL_VNNI

// P pairs of groups (16P rows) × T tokens in 16-lane vectors, each pair's lanes 0–7
// its first group's rows and 8–15 its second's: Interleaved8Tile's exact block dots
// (vpdpbusd), the same FMA per block and chunk tree per lane, so the same bits, at
// twice the width. Prefill tiles are 1 pair × 4 tokens; a GEMV 4 pairs × 1 token
// (8 streams, as Interleaved8Gemv).
template <WeightType kType, int P, int T>
void Interleaved8PairTile(const MatMulArgs& a, int64_t r0, int64_t t0) {
  constexpr int64_t kGroupBlock = 8 * BlockBytes(kType);
  const int64_t group_bytes = 8 * a.w.row_bytes;
  const uint8_t* first = a.w.data + r0 * a.w.row_bytes;
  const int64_t blocks_per_chunk = a.chunk_elems / 32;
  // As in EightRowBlocks: a decode-sized batch's first tile prefetches the next
  // tile's groups. So does a Q4_0 GEMV: 1.1B Q4_0 decode 30–41 → 37–50 tok/s on one
  // thread, 55–73 → 66–69 on two (interleaved A/B, 4 rounds). A Q8_0 GEMV over rows
  // of ≤ 1024 columns too: each group's stream is too short for the hardware
  // prefetcher (6.5 KiB on the 110M model), and prefetching made a whole 300-token
  // 110M generation 8% faster on one thread (median of 10 alternating pairs, every
  // pair faster), the same on two.
  const bool stream = (T > 1 && t0 == 0 && a.n_tokens <= kStreamTokens) ||
                      (T == 1 && (kType == WeightType::kQ4_0 || a.w.cols <= kShortRowCols));
  // A Q8_0 GEMV over longer rows prefetches its own 8 streams' next block instead
  // (the next tile's groups cost the 1.1B's decode 26–27 → 24–25 tok/s): one Zen 5
  // core's GEMV read 26–28.5 → 30–33 GB/s on the 1.1B's 2048-column matrices
  // (kernels_bench, 3 alternating rounds), and a 1.1B Q8_0 generation took 0.91× the
  // time on one thread, 0.85× on two (median of 8 alternating pairs, whole process).
  const bool next_block = T == 1 && !stream;
  const TokenRows<T> act(*a.xq, t0);
  if (a.k_chunks < 1 || a.k_chunks > kMaxKChunks) __builtin_unreachable();  // MatMul checked
  const auto both = [&](const uint8_t* block, int p, int64_t offset) {  // pair p's 2 × 32 bytes
    return PairBytes32(block + 2 * p * group_bytes + offset, group_bytes);
  };
  __m512 partial[P][T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m512 acc[P][T];
    TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        acc[p][t] = _mm512_setzero_ps();
    for (int64_t j = c * blocks_per_chunk; j < (c + 1) * blocks_per_chunk; ++j) {
      const uint8_t* block = first + j * kGroupBlock;  // the first group's block j
      if (stream || next_block) {  // 2P groups' block, fetched while this one is read
        const uint8_t* ahead = stream ? block + 2 * P * group_bytes  // the next tile's, block j
                                      : block + kGroupBlock;         // ours, block j + 1
        TESSERA_UNROLL for (int g = 0; g < 2 * P; ++g) {
          PrefetchLines(ahead + g * group_bytes, kGroupBlock);
        }
      }
      const auto x4 = [&](int t, int e, uint32_t flip) {  // activations e..e+3, every lane
        uint32_t v;
        std::memcpy(&v, act.qs[t] + j * 32 + e, 4);
        return _mm512_set1_epi32(static_cast<int32_t>(v ^ flip));
      };
      TESSERA_UNROLL for (int p = 0; p < P; ++p) {
        const uint8_t* b0 = block + 2 * p * group_bytes;
        const __m512 dw = PairHalfs(b0, group_bytes);
        __m512i dot[T];
        if constexpr (kType == WeightType::kQ8_0) {
          // (x + 128)·w less 128·Σw, as in Interleaved8Tile.
          __m512i w_sum = _mm512_setzero_si512();
          TESSERA_UNROLL for (int t = 0; t < T; ++t) dot[t] = _mm512_setzero_si512();
          TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
            const __m512i w = both(block, p, 16 + 32 * k);
            w_sum = _mm512_dpbusd_epi32(w_sum, _mm512_set1_epi8(1), w);
            TESSERA_UNROLL for (int t = 0; t < T; ++t) {
              dot[t] = _mm512_dpbusd_epi32(dot[t], x4(t, 4 * k, 0x80808080u), w);
            }
          }
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            dot[t] = _mm512_sub_epi32(dot[t], _mm512_slli_epi32(w_sum, 7));
          }
        } else {
          const __m512i low4 = _mm512_set1_epi8(0x0F);
          TESSERA_UNROLL for (int t = 0; t < T; ++t) {
            dot[t] = _mm512_set1_epi32(-8 * act.sum[t][j]);
          }
          TESSERA_UNROLL for (int k = 0; k < 4; ++k) {
            const __m512i v = both(block, p, 16 + 32 * k);
            const __m512i lo = _mm512_and_si512(v, low4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            TESSERA_UNROLL for (int t = 0; t < T; ++t) {
              dot[t] = _mm512_dpbusd_epi32(dot[t], lo, x4(t, 4 * k, 0));
              dot[t] = _mm512_dpbusd_epi32(dot[t], hi, x4(t, 16 + 4 * k, 0));
            }
          }
        }
        TESSERA_UNROLL for (int t = 0; t < T; ++t) {
          acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]),
                                      _mm512_mul_ps(dw, _mm512_set1_ps(act.d[t][j])), acc[p][t]);
        }
      }
    }
    TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        partial[p][t][c] = acc[p][t];
  }
  TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + r0 + 16 * p,
                     TreeSumLanes(partial[p][t], a.k_chunks));
  }
}

#endif  // TESSERA_MATMUL_VNNI

// A GEMV over G groups of the kInterleaved8 layout at once (rows [r0, r0 + 8G)): G
// sequential streams for the prefetchers and G independent FMA chains, the same
// integer block dots and FMAs per row as Interleaved8Tile, so the same bits.
// Each block prefetches, for every group, the block it reads next in memory order:
// the next tile's block j while a tile is at most kNextTilePrefetchBytes, else its
// own block j + 1 (a tile of longer rows is read long before the prefetch is used).
// Zen 5 running this AVX2 code (kernels_bench with TESSERA_BENCH_TARGET=AVX2, the
// build before and this one alternating, 3 rounds, the 1.1B's and the 110M's shapes):
// 0.48–0.88× the time without prefetching, every shape faster on 1 and 2 threads
// (Q4_0 one thread 0.48–0.69×, Q8_0 0.50–0.88×). On Q8_0 rows of 5632 columns (383
// KiB tiles) the next tile took 1.07–1.28× the time of the own next block.
constexpr int64_t kNextTilePrefetchBytes = int64_t{256} << 10;

template <WeightType kType, int G>
void Interleaved8Gemv(const MatMulArgs& a, int64_t r0) {
  constexpr int64_t kGroupBlock = 8 * BlockBytes(kType);
  const uint8_t* group[G];
  TESSERA_UNROLL for (int g = 0; g < G; ++g) group[g] = a.w.data + (r0 + 8 * g) * a.w.row_bytes;
  const int64_t tile_bytes = G * 8 * a.w.row_bytes;
  const int64_t ahead = tile_bytes <= kNextTilePrefetchBytes ? tile_bytes : kGroupBlock;
  const TokenRows<1> act(*a.xq, 0);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const int64_t blocks_per_chunk = a.chunk_elems / 32;
  __m256 partial[G][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m256 acc[G];
    TESSERA_UNROLL for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t j = c * blocks_per_chunk; j < (c + 1) * blocks_per_chunk; ++j) {
      const int8_t* xb = act.qs[0] + j * 32;
      const auto x4 = [&](int e) {  // activations e..e+3, every lane
        int32_t v;
        std::memcpy(&v, xb + e, 4);
        return _mm256_set1_epi32(v);
      };
      const __m256 dx = _mm256_set1_ps(act.d[0][j]);
      TESSERA_UNROLL for (int g = 0; g < G; ++g) {
        const uint8_t* next = group[g] + j * kGroupBlock + ahead;
        PrefetchLines(next, kGroupBlock);
      }
      TESSERA_UNROLL for (int g = 0; g < G; ++g) {
        const uint8_t* block = group[g] + j * kGroupBlock;
        const auto chunk = [&](int k) {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * k));
        };
        __m256i dot;
        if constexpr (kType == WeightType::kQ8_0) {
          dot = _mm256_setzero_si256();
          TESSERA_UNROLL for (int k = 0; k < 8; ++k) {
            const __m256i w = chunk(k);
            const __m256i p =
                _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x4(4 * k), w));
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, ones16));
          }
        } else {
          const __m256i low4 = _mm256_set1_epi8(0x0F);
          __m256i sum = _mm256_setzero_si256();
          TESSERA_UNROLL for (int k = 0; k < 4; ++k) {
            const __m256i v = chunk(k);
            sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(_mm256_and_si256(v, low4), x4(4 * k)));
            sum = _mm256_add_epi16(
                sum, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                          x4(16 + 4 * k)));
          }
          dot = _mm256_sub_epi32(_mm256_madd_epi16(sum, ones16),
                                 _mm256_set1_epi32(8 * act.sum[0][j]));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, dx), acc[g]);
      }
    }
    TESSERA_UNROLL for (int g = 0; g < G; ++g) partial[g][c] = acc[g];
  }
  TESSERA_UNROLL for (int g = 0; g < G; ++g) {
    _mm256_storeu_ps(a.y + r0 + 8 * g, TreeSumLanes(partial[g], a.k_chunks));
  }
}

template <WeightType kType, int G>
void Interleaved8GemvRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + 8 * G <= row_end; r += 8 * G) Interleaved8Gemv<kType, G>(a, r);
  if constexpr (G > 1) {
    if (r < row_end) Interleaved8GemvRows<kType, G / 2>(a, r, row_end);
  }
}

#if TESSERA_MATMUL_VNNI
// A GEMV in tiles of P pairs, the rest in smaller ones, an odd last group alone.
template <WeightType kType, int P>
void Interleaved8PairGemvRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + 16 * P <= row_end; r += 16 * P) Interleaved8PairTile<kType, P, 1>(a, r, 0);
  if constexpr (P > 1) {
    if (r < row_end) Interleaved8PairGemvRows<kType, P / 2>(a, r, row_end);
  } else if (r < row_end) {
    Interleaved8Gemv<kType, 1>(a, r);
  }
}

#endif  // TESSERA_MATMUL_VNNI

// A GEMV reads 8 groups (64 rows) at once: 1.1B Q8_0 decode 14–15 → 18–22 tok/s on
// one thread, 23–26 → 24–35 on two (one group at a time with the next group
// prefetched before; interleaved A/B, 3 rounds); Q4_0 and the 110M model within noise.
constexpr int kGemvGroups = 8;

void Interleaved8Rows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  const bool q8 = a.w.type == WeightType::kQ8_0;
#if TESSERA_MATMUL_VNNI
  // Pairs of groups in 16-lane vectors; an odd last group of the range alone.
  if (a.n_tokens == 1) {
    if (q8)
      return Interleaved8PairGemvRows<WeightType::kQ8_0, kGemvGroups / 2>(a, row_begin, row_end);
    return Interleaved8PairGemvRows<WeightType::kQ4_0, kGemvGroups / 2>(a, row_begin, row_end);
  }
  EightRowTiles<16>(a, row_begin, row_end, [&](auto tokens, int64_t r, int rows, int64_t t0) {
    constexpr int T = decltype(tokens)::value;
    if (q8) {
      if (rows == 16) return Interleaved8PairTile<WeightType::kQ8_0, 1, T>(a, r, t0);
      return Interleaved8Tile<WeightType::kQ8_0, T>(a, r, t0);
    }
    if (rows == 16) return Interleaved8PairTile<WeightType::kQ4_0, 1, T>(a, r, t0);
    Interleaved8Tile<WeightType::kQ4_0, T>(a, r, t0);
  });
#else
  if (a.n_tokens == 1) {
    if (q8) return Interleaved8GemvRows<WeightType::kQ8_0, kGemvGroups>(a, row_begin, row_end);
    return Interleaved8GemvRows<WeightType::kQ4_0, kGemvGroups>(a, row_begin, row_end);
  }
  EightRowTiles(a, row_begin, row_end,
                [&](auto tokens, int64_t r, int /*rows: always 8*/, int64_t t0) {
                  if (q8) {
                    Interleaved8Tile<WeightType::kQ8_0, decltype(tokens)::value>(a, r, t0);
                  } else {
                    Interleaved8Tile<WeightType::kQ4_0, decltype(tokens)::value>(a, r, t0);
                  }
                });
#endif
}

#else  // !TESSERA_MATMUL_X86

template <WeightType kType>
void BlockScaledRows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  OneOutputAtATime(a, row_begin, row_end, BlockScaledOne<kType>);
}

void Interleaved8Rows(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.w.type == WeightType::kQ8_0)
    return BlockScaledRows<WeightType::kQ8_0>(a, row_begin, row_end);
  BlockScaledRows<WeightType::kQ4_0>(a, row_begin, row_end);
}

#endif  // TESSERA_MATMUL_X86

// Rows [row_begin, row_end) of a Q8_0 or Q4_0 matrix, either layout.
void MatMulBlockScaledRowsImpl(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.w.layout == WeightLayout::kInterleaved8) return Interleaved8Rows(a, row_begin, row_end);
  switch (a.w.type) {
    case WeightType::kQ8_0:
      return BlockScaledRows<WeightType::kQ8_0>(a, row_begin, row_end);
    case WeightType::kQ4_0:
      return BlockScaledRows<WeightType::kQ4_0>(a, row_begin, row_end);
    default:
      TESSERA_CHECK(false) << "MatMulBlockScaledRows takes Q8_0 and Q4_0, not "
                           << TraitsOf(a.w.type).name;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {

HWY_EXPORT(MatMulBlockScaledRowsImpl);

void MatMulBlockScaledRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulBlockScaledRowsImpl)(args, row_begin, row_end);
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
