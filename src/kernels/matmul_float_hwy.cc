// Per-target MatMul kernels for float weights (F32, F16, BF16), compiled once per
// Highway target by foreach_target; see matmul.h for the order-of-summation contract.
//
// The weights are read in groups of 8 rows with the 8 rows' elements of one column k
// side by side (kInterleaved8, or packed so on the fly from kRows), so one vector
// holds column k of 8 rows: lanes = rows. Each output keeps its own FMA chain in
// k order, acc = fma(w[r, k], x[t, k], acc), the contract's sequential chunk sum,
// fed by one broadcast activation per (token, k). There are no horizontal sums, and
// the bits are those of the scalar loop on every target. A tile is G groups × T
// tokens: G·T independent chains cover the FMA latency (decode: 8 groups × 1 token).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_float_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "base/half.h"
#include "kernels/matmul_internal.h"
#include "kernels/matmul_target-inl.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {

template <WeightType kType>
constexpr int64_t kElemBytes = kType == WeightType::kF32 ? 4 : 2;

// The rows of one call: `groups` (groups of 8 rows, kGroupRows element columns
// each, `stride` bytes apart) whose first row is output row r0; `rows` of them are
// real (a packed tail group is zero-padded).
struct Groups {
  const uint8_t* data = nullptr;
  int64_t stride = 0;
  int64_t r0 = 0;
  int64_t rows = 0;
};

// Writes the 8 outputs of group g (rows r0 + 8g …) for token t, only real rows.
HWY_INLINE void StoreGroup(const MatMulArgs& a, const Groups& s, int64_t g, int64_t t,
                           const float* sums) {
  const int64_t first = 8 * g, n = std::min<int64_t>(8, s.rows - first);
  std::memcpy(a.y + t * a.y_stride + s.r0 + first, sums, static_cast<size_t>(n) * sizeof(float));
}

#if TESSERA_MATMUL_X86

// Column k of a group: its 8 rows' elements, as f32.
template <WeightType kType>
HWY_INLINE __m256 LoadColumn(const uint8_t* group, int64_t k) {
  const uint8_t* p = group + k * kGroupRows * kElemBytes<kType>;
  if constexpr (kType == WeightType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kType == WeightType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

// Groups [g0, g0 + G) × tokens [t0, t0 + T): per chunk, G·T chains in k order, then
// the chunk tree per lane.
template <WeightType kType, int G, int T>
void GroupTile(const MatMulArgs& a, const Groups& s, int64_t g0, int64_t t0, int64_t ahead) {
  const uint8_t* group[G];
  const float* xrow[T];
  TESSERA_UNROLL for (int g = 0; g < G; ++g) group[g] = s.data + (g0 + g) * s.stride;
  TESSERA_UNROLL for (int t = 0; t < T; ++t) xrow[t] = a.x + (t0 + t) * a.x_stride;
  __m256 partial[G][T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m256 acc[G][T];
    TESSERA_UNROLL for (int g = 0; g < G; ++g) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        acc[g][t] = _mm256_setzero_ps();
    const int64_t k1 = (c + 1) * a.chunk_elems;
    _Pragma("GCC unroll 4") for (int64_t k = c * a.chunk_elems; k < k1; ++k) {
      // The first token tile fetches the next block's groups into L2 as it goes.
      constexpr int64_t kLine = 64 / (kGroupRows * kElemBytes<kType>);  // columns a line
      if (ahead > 0 && k % kLine == 0) {
        TESSERA_UNROLL for (int g = 0; g < G; ++g) {
          __builtin_prefetch(group[g] + ahead + k * kGroupRows * kElemBytes<kType>);
        }
      }
      __m256 w[G];
      TESSERA_UNROLL for (int g = 0; g < G; ++g) w[g] = LoadColumn<kType>(group[g], k);
      TESSERA_UNROLL for (int t = 0; t < T; ++t) {
        const __m256 xb = _mm256_broadcast_ss(xrow[t] + k);
        TESSERA_UNROLL for (int g = 0; g < G; ++g) acc[g][t] = _mm256_fmadd_ps(w[g], xb, acc[g][t]);
      }
    }
    TESSERA_UNROLL for (int g = 0; g < G; ++g) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        partial[g][t][c] = acc[g][t];
  }
  TESSERA_UNROLL for (int g = 0; g < G; ++g) TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    HWY_ALIGN float sums[8];
    _mm256_store_ps(sums, TreeSumLanes(partial[g][t], a.k_chunks));
    StoreGroup(a, s, g0 + g, t0 + t, sums);
  }
}

#if TESSERA_MATMUL_AVX512

// Column k of groups `first` and `second` in one 16-lane vector: lanes 0–7 the first
// group's 8 rows, lanes 8–15 the second's (two groups, not two columns: every lane
// stays one row's chain in k order).
template <WeightType kType>
HWY_INLINE __m512 LoadColumnPair(const uint8_t* first, const uint8_t* second, int64_t k) {
  const int64_t offset = k * kGroupRows * kElemBytes<kType>;
  if constexpr (kType == WeightType::kF32) {
    const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(first + offset));
    const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(second + offset));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  } else {
    const __m256i halves = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(first + offset))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(second + offset)), 1);
    if constexpr (kType == WeightType::kF16) return _mm512_cvtph_ps(halves);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }
}

// Groups [g0, g0 + 2P) × tokens [t0, t0 + T) in P 16-lane vectors of two groups each:
// GroupTile's chains (same order, same bits) at twice the width. Column k of pair p
// comes from s's groups 2p and 2p + 1 (converted to f32 here), or with kWide from
// `wide` (a block already widened to f32, 16 floats a column for each pair: see
// WidenedGroupRows); groups from g_end on are padding and not stored.
template <WeightType kType, int P, int T, bool kWide = false>
void PairTile(const MatMulArgs& a, const Groups& s, int64_t g0, int64_t t0, int64_t ahead,
              const float* wide = nullptr, int64_t g_end = INT64_MAX) {
  const uint8_t* group[2 * P];
  const float* pair[P];
  const float* xrow[T];
  if constexpr (kWide) {
    TESSERA_UNROLL for (int p = 0; p < P; ++p) pair[p] = wide + p * 16 * a.w.cols;
  } else {
    TESSERA_UNROLL for (int g = 0; g < 2 * P; ++g) group[g] = s.data + (g0 + g) * s.stride;
  }
  TESSERA_UNROLL for (int t = 0; t < T; ++t) xrow[t] = a.x + (t0 + t) * a.x_stride;
  __m512 partial[P][T][kMaxKChunks];
  for (int c = 0; c < a.k_chunks; ++c) {
    __m512 acc[P][T];
    TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        acc[p][t] = _mm512_setzero_ps();
    const int64_t k1 = (c + 1) * a.chunk_elems;
    _Pragma("GCC unroll 4") for (int64_t k = c * a.chunk_elems; k < k1; ++k) {
      __m512 w[P];
      if constexpr (kWide) {
        TESSERA_UNROLL for (int p = 0; p < P; ++p) w[p] = _mm512_load_ps(pair[p] + 16 * k);
      } else {
        constexpr int64_t kLine = 64 / (kGroupRows * kElemBytes<kType>);  // columns a line
        if (ahead > 0 && k % kLine == 0) {
          TESSERA_UNROLL for (int g = 0; g < 2 * P; ++g) {
            __builtin_prefetch(group[g] + ahead + k * kGroupRows * kElemBytes<kType>);
          }
        }
        TESSERA_UNROLL for (int p = 0; p < P; ++p) {
          w[p] = LoadColumnPair<kType>(group[2 * p], group[2 * p + 1], k);
        }
      }
      TESSERA_UNROLL for (int t = 0; t < T; ++t) {
        const __m512 xb = _mm512_set1_ps(xrow[t][k]);
        TESSERA_UNROLL for (int p = 0; p < P; ++p) acc[p][t] = _mm512_fmadd_ps(w[p], xb, acc[p][t]);
      }
    }
    TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t)
        partial[p][t][c] = acc[p][t];
  }
  TESSERA_UNROLL for (int p = 0; p < P; ++p) TESSERA_UNROLL for (int t = 0; t < T; ++t) {
    HWY_ALIGN float sums[16];
    _mm512_store_ps(sums, TreeSumLanes(partial[p][t], a.k_chunks));
    StoreGroup(a, s, g0 + 2 * p, t0 + t, sums);
    if (!kWide || g0 + 2 * p + 1 < g_end) StoreGroup(a, s, g0 + 2 * p + 1, t0 + t, sums + 8);
  }
}

#endif  // TESSERA_MATMUL_AVX512

#else  // !TESSERA_MATMUL_X86

template <WeightType kType>
float ElementAt(const uint8_t* p) {
  if constexpr (kType == WeightType::kF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return kType == WeightType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
  }
}

// The same chains one output at a time in scalar code (std::fma: the same bits).
template <WeightType kType, int G, int T>
void GroupTile(const MatMulArgs& a, const Groups& s, int64_t g0, int64_t t0, int64_t /*ahead*/) {
  for (int64_t g = g0; g < g0 + G; ++g) {
    const uint8_t* group = s.data + g * s.stride;
    for (int64_t t = t0; t < t0 + T; ++t) {
      const float* x = a.x + t * a.x_stride;
      float sums[8];
      for (int lane = 0; lane < 8; ++lane) {
        float partial[kMaxKChunks];
        for (int c = 0; c < a.k_chunks; ++c) {
          float acc = 0.0f;
          for (int64_t k = c * a.chunk_elems; k < (c + 1) * a.chunk_elems; ++k) {
            acc = std::fma(ElementAt<kType>(group + (k * kGroupRows + lane) * kElemBytes<kType>),
                           x[k], acc);
          }
          partial[c] = acc;
        }
        sums[lane] = TreeSum(partial, 0, a.k_chunks);
      }
      StoreGroup(a, s, g, t, sums);
    }
  }
}

#endif  // TESSERA_MATMUL_X86

// Tiles of G groups, the remaining groups in smaller tiles (3 → 2 → 1, 8 → 4 → 2 →
// 1: more chains than one group at a time).
// `ahead`: how far past the column it reads a group prefetches, in bytes (0: none).
template <WeightType kType, int G, int T>
HWY_INLINE void GroupTiles(const MatMulArgs& a, const Groups& s, int64_t g_begin, int64_t g_end,
                           int64_t t0, int64_t ahead = 0) {
  int64_t g = g_begin;
#if TESSERA_MATMUL_AVX512
  // Pairs of groups in 16-lane vectors, an odd last group alone.
  if constexpr (G % 2 == 0) {
    for (; g + G <= g_end; g += G) PairTile<kType, G / 2, T>(a, s, g, t0, ahead);
    if constexpr (G > 2) {
      if (g < g_end) GroupTiles<kType, G - 2, T>(a, s, g, g_end, t0, ahead);
    } else if (g < g_end) {
      GroupTile<kType, 1, T>(a, s, g, t0, ahead);
    }
    return;
  }
#endif
  for (; g + G <= g_end; g += G) GroupTile<kType, G, T>(a, s, g, t0, ahead);
  if constexpr (G > 1) {
    if (g < g_end) GroupTiles<kType, G == 3 ? 2 : G / 2, T>(a, s, g, g_end, t0, ahead);
  }
}

// Decode reads 8 groups (64 rows) at once: 8 chains, each group's stream prefetched
// kGemvAheadBytes (4 lines) past the column it reads. 1.1B F16 `generate -n 64`,
// whole process, 6 alternating pairs: 0.957x the time of no prefetch on one thread
// (every pair 0.95–0.96x), 0.944x on two; 128 bytes 1.013x the time of 256.
// kernels_bench, one thread, 3 alternating rounds: 5632x2048 25.0-25.5 -> 25.7-27.2
// GB/s, 768x768 21.0-21.8 -> 21.7-23.1; 512 or 1024 bytes ahead were slower than none
// on the large shapes.
// A batch takes tiles of 3 groups × 4 tokens (12 chains; a pipeline's 4-sequence
// micro-batch is one tile), the last 1–3 tokens their own tile; a block of
// kBlockGroups stays in L2 across token tiles.
constexpr int kGemvGroups = 8;
constexpr int64_t kGemvAheadBytes = 256;
#if TESSERA_MATMUL_AVX512
constexpr int kTileGroups = 6, kTileTokens = 8;  // 3 pairs × 8 tokens: 24 16-lane chains
#else
constexpr int kTileGroups = 3, kTileTokens = 4;
#endif
constexpr int64_t kBlockGroups = 6;

// The last n (< kTileTokens) tokens of a block of groups, one tile of n; when they are
// the first tile (a decode-sized batch), it prefetches the next block as it goes.
template <WeightType kType, int T>
HWY_INLINE void TailTile(const MatMulArgs& a, const Groups& s, int64_t b, int64_t b_end, int64_t t0,
                         int64_t n, int64_t ahead) {
  if constexpr (T >= 1) {
    if (n == T) return GroupTiles<kType, kTileGroups, T>(a, s, b, b_end, t0, ahead);
    TailTile<kType, T - 1>(a, s, b, b_end, t0, n, ahead);
  }
}

#if TESSERA_MATMUL_AVX512
// A prefill-sized batch widens each block of F16/BF16 groups to f32 once (exactly),
// pairs of groups side by side (column k of groups 2p and 2p + 1 as 16 floats), and
// runs its token tiles on that: one aligned load per pair and column, no conversion
// or insert per tile. The same chains, so the same bits. One Zen 5 core
// (kernels_bench, 512 tokens, 3 alternating rounds): 2048×2048 F16 173–186 →
// 182–197 GFLOP/s, 5632×2048 174–183 → 184–197 (the FMA peak measures ~220). Below
// 256 tokens the widening costs more than it saves (64 tokens: 177–181 → 163–172),
// and from 4096 columns on the widened block (6 groups: 192 bytes a column) no longer
// stays in L2 with the tile's activations (2048×5632: no gain at 256 or 512 tokens).
constexpr int64_t kWidenTokens = 256;
constexpr int64_t kWidenMaxCols = 4096;

// Tokens [t0, t0 + T) over a widened block's pairs (groups [g0, g0 + n) of `s`):
// tiles of 3 pairs, then 2, then 1.
template <int T>
void WidePairTiles(const MatMulArgs& a, const Groups& s, const float* pairs, int64_t n_pairs,
                   int64_t g0, int64_t n, int64_t t0) {
  constexpr WeightType kF32 = WeightType::kF32;  // the widened block's type
  const int64_t pair_floats = 16 * a.w.cols, g_end = g0 + n;
  int64_t p = 0;
  for (; p + 3 <= n_pairs; p += 3) {
    PairTile<kF32, 3, T, true>(a, s, g0 + 2 * p, t0, 0, pairs + p * pair_floats, g_end);
  }
  if (n_pairs - p == 2) {
    PairTile<kF32, 2, T, true>(a, s, g0 + 2 * p, t0, 0, pairs + p * pair_floats, g_end);
  } else if (n_pairs - p == 1) {
    PairTile<kF32, 1, T, true>(a, s, g0 + 2 * p, t0, 0, pairs + p * pair_floats, g_end);
  }
}

template <int T>
void WideTailTile(const MatMulArgs& a, const Groups& s, const float* pairs, int64_t n_pairs,
                  int64_t g0, int64_t n, int64_t t0, int64_t tokens) {
  if constexpr (T >= 1) {
    if (tokens == T) return WidePairTiles<T>(a, s, pairs, n_pairs, g0, n, t0);
    WideTailTile<T - 1>(a, s, pairs, n_pairs, g0, n, t0, tokens);
  }
}

template <WeightType kType>
void WidenedGroupRows(const MatMulArgs& a, const Groups& s) {
  const int64_t n_groups = (s.rows + kGroupRows - 1) / kGroupRows;
  const int64_t cols = a.w.cols;
  static thread_local std::vector<float> storage;
  storage.resize(static_cast<size_t>((kBlockGroups + 1) / 2 * 16 * cols + 16));
  float* wide = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) &
                                         ~uintptr_t{63});  // 64-byte loads on line boundaries
  for (int64_t b = 0; b < n_groups; b += kBlockGroups) {
    const int64_t n = std::min(kBlockGroups, n_groups - b), n_pairs = (n + 1) / 2;
    for (int64_t p = 0; p < n_pairs; ++p) {
      const uint8_t* first = s.data + (b + 2 * p) * s.stride;
      float* dst = wide + p * 16 * cols;
      if (2 * p + 1 < n) {
        const uint8_t* second = first + s.stride;
        for (int64_t k = 0; k < cols; ++k) {
          _mm512_store_ps(dst + 16 * k, LoadColumnPair<kType>(first, second, k));
        }
      } else {  // an odd last group: zeros beside it
        for (int64_t k = 0; k < cols; ++k) {
          _mm512_store_ps(dst + 16 * k,
                          _mm512_insertf32x8(_mm512_setzero_ps(), LoadColumn<kType>(first, k), 0));
        }
      }
    }
    int64_t t0 = 0;
    for (; t0 + kTileTokens <= a.n_tokens; t0 += kTileTokens) {
      WidePairTiles<kTileTokens>(a, s, wide, n_pairs, b, n, t0);
    }
    WideTailTile<kTileTokens - 1>(a, s, wide, n_pairs, b, n, t0, a.n_tokens - t0);
  }
}
#endif

template <WeightType kType>
void GroupRows(const MatMulArgs& a, const Groups& s) {
  const int64_t n_groups = (s.rows + kGroupRows - 1) / kGroupRows;
  if (a.n_tokens == 1) {
    return GroupTiles<kType, kGemvGroups, 1>(a, s, 0, n_groups, 0, kGemvAheadBytes);
  }
#if TESSERA_MATMUL_AVX512
  if constexpr (kType != WeightType::kF32) {
    if (a.n_tokens >= kWidenTokens && a.w.cols <= kWidenMaxCols) {
      return WidenedGroupRows<kType>(a, s);
    }
  }
#endif
  for (int64_t b = 0; b < n_groups; b += kBlockGroups) {
    const int64_t b_end = std::min(n_groups, b + kBlockGroups);
    // Up to the last group of the next block.
    const int64_t ahead = b_end + kBlockGroups <= n_groups ? kBlockGroups * s.stride : 0;
    int64_t t0 = 0;
    for (; t0 + kTileTokens <= a.n_tokens; t0 += kTileTokens) {
      GroupTiles<kType, kTileGroups, kTileTokens>(a, s, b, b_end, t0, t0 == 0 ? ahead : 0);
    }
    TailTile<kType, kTileTokens - 1>(a, s, b, b_end, t0, a.n_tokens - t0, t0 == 0 ? ahead : 0);
  }
}

template <WeightType kType>
void FloatRowsFor(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int64_t kGroupBytes = kGroupRows * kElemBytes<kType>;  // one column of a group
  if (a.w.layout == WeightLayout::kInterleaved8) {
    GroupRows<kType>(a, {.data = a.w.data + row_begin * a.w.row_bytes,
                         .stride = kGroupRows * a.w.row_bytes,
                         .r0 = row_begin,
                         .rows = row_end - row_begin});
    return;
  }
  // kRows: a slab of rows at a time packed into groups (zero-padded), then the same
  // tiles over it for every token; the packing is paid once per slab.
  const int64_t slab_rows = kGroupRows * (a.n_tokens == 1 ? kGemvGroups : kBlockGroups);
  const int64_t group_stride = a.w.cols * kGroupBytes;
  static thread_local std::vector<uint8_t> packed;
  packed.resize(static_cast<size_t>(slab_rows / kGroupRows * group_stride));
  for (int64_t r = row_begin; r < row_end; r += slab_rows) {
    const int64_t rows = std::min(slab_rows, row_end - r);
    PackFloatGroups(a.w, r, r + rows, packed.data());
    GroupRows<kType>(a, {.data = packed.data(), .stride = group_stride, .r0 = r, .rows = rows});
  }
}

void MatMulFloatRowsImpl(const MatMulArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.w.type) {
    case WeightType::kF32:
      return FloatRowsFor<WeightType::kF32>(a, row_begin, row_end);
    case WeightType::kF16:
      return FloatRowsFor<WeightType::kF16>(a, row_begin, row_end);
    default:
      return FloatRowsFor<WeightType::kBF16>(a, row_begin, row_end);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {

HWY_EXPORT(MatMulFloatRowsImpl);

void MatMulFloatRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulFloatRowsImpl)(args, row_begin, row_end);
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
