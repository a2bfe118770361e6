// Per-target paged attention. For one KV head and a tile of queries: pass 1 scores
// every (query, position) pair with an 8-lane dot over head_dim, loading each K row
// once; pass 2 is a per-query softmax over [0, pos]; pass 3 accumulates p·V in
// position order, loading each V row once. Every per-query operation sequence is the
// same whatever the tile, so multi-query == single-query bitwise. On x86 from AVX2
// up every target gives the same bits: AVX-512 holds two rows' 8-lane dot
// accumulators in one register and 4 rows × 64 dims of p·V accumulators in 16,
// each lane the same FMA chain as AVX2's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "base/check.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/attention.h"
#include "kernels/f32x8_target-inl.h"
#include "kernels/prefetch.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE float Dot(DF df, const float* a, const float* b, int64_t n) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc);
  if (i < n)
    acc = hn::MulAdd(LoadPadded(df, a + i, n - i, 0), LoadPadded(df, b + i, n - i, 0), acc);
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

// out[0, n) += s * v[0, n)
HWY_INLINE void Axpy(DF df, float s, const float* v, float* out, int64_t n) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const VF vs = hn::Set(df, s);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(vs, hn::LoadU(df, v + i), hn::LoadU(df, out + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] += s * v[i];
}

// Softmax numerators of one span in place: s[i] = exp(s[i] - max) over s[0, n);
// returns Σ and sets *max.
HWY_INLINE float ExpSpan(DF df, float* s, int64_t n, float* max) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const float kNegInf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Set(df, kNegInf);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) vmax = hn::Max(vmax, hn::LoadU(df, s + i));
  if (i < n) vmax = hn::Max(vmax, LoadPadded(df, s + i, n - i, kNegInf));
  *max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const VF vm = hn::Set(df, *max);
  VF sum = hn::Zero(df);
  for (i = 0; i + lanes <= n; i += lanes) {
    const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm));
    sum = hn::Add(sum, e);
    hn::StoreU(e, df, s + i);
  }
  if (i < n) {
    HWY_ALIGN float buf[8];
    const VF e = hn::Exp(df, hn::Sub(LoadPadded(df, s + i, n - i, kNegInf), vm));
    sum = hn::Add(sum, e);
    hn::Store(e, df, buf);
    for (int64_t j = 0; j < n - i; ++j) s[i + j] = buf[j];
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// A row's softmax over its spans: Begin with span 0's partial (written straight into
// the output), Add each later span's (folded in ascending order), Finish divides.
struct SpanFold {
  float max = 0.0f;
  float sum = 0.0f;

  void Add(int64_t span_index, float span_max, float span_sum, const float* span_out, float* out,
           int64_t n) {
    if (span_index == 0) {
      max = span_max;
      sum = span_sum;
      return;
    }
    FoldAttentionSpan(max, sum, out, span_max, span_sum, span_out, n);
  }
  void Finish(float* out, int64_t n) const {
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < n; ++d) out[d] *= inv;
  }
};

// Row (position p, KV head h) of a pool as f32: a pointer into an f32 pool, or
// converted into buf for f16.
HWY_INLINE const float* KvRow(const KvLayout& layout, const void* pool, const int32_t* table,
                              int64_t p, int64_t h, float* buf) {
  const int64_t index = layout.RowIndex(table[p / layout.block_size], p % layout.block_size, h);
  if (layout.type == KvType::kF32) return static_cast<const float*>(pool) + index;
  const hwy::float16_t* src = static_cast<const hwy::float16_t*>(pool) + index;
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= layout.head_dim; i += lanes) {
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, buf + i);
  }
  for (; i < layout.head_dim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + i, 2);
    buf[i] = F16ToF32(bits);
  }
  return buf;
}

#undef TESSERA_ATTN_X86
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TESSERA_ATTN_X86 1
#else
#define TESSERA_ATTN_X86 0
#endif
#undef TESSERA_ATTN_AVX512
#if TESSERA_ATTN_X86 && HWY_TARGET <= HWY_AVX3
#define TESSERA_ATTN_AVX512 1
#else
#define TESSERA_ATTN_AVX512 0
#endif

#if TESSERA_ATTN_X86
// The x86 path for head_dim % 8 == 0: up to 8 heads of a KV group at a time.

// Lane g of the result = sum of a[g]'s lanes, as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))
// for every g (hadd pairs lanes, then the two 128-bit halves are added).
HWY_INLINE __m256 ReduceEight(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

HWY_INLINE __m256 LoadRow8(const void* row, bool f16, int64_t i) {
  if (f16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i)));
  }
  return _mm256_loadu_ps(static_cast<const float*>(row) + i);
}

// scores[j] = (q[j]·k) · scale for j < N.
template <int N>
HWY_INLINE void GroupDots(const float* const* q, const void* k, bool f16, int64_t head_dim,
                          float scale, float* scores) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < head_dim; i += 8) {
    const __m256 kv = LoadRow8(k, f16, i);
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i), kv, acc[j]);
  }
  HWY_ALIGN float sums[8];
  _mm256_store_ps(sums, ReduceEight(acc));
  for (int j = 0; j < N; ++j) scores[j] = sums[j] * scale;
}

// scores[j] = (q·k_j) · scale for the n ≤ 8 rows k[0, n): one query against 8
// positions, for a lone (query, head) row (decode without grouped heads). Each dot
// is the same FMA sequence and the same ReduceEight lane tree as GroupDots, so the
// bits are GroupDots<1>'s; the 8 dots share one reduction instead of one each.
// N is a compile-time count so that the 8 accumulators stay in registers (with a
// run-time count GCC kept them on the stack: a load and a store around every FMA).
template <int N>
HWY_INLINE void PositionDotsN(const float* q, const void* const* k, bool f16, int64_t head_dim,
                              float scale, float* scores) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < head_dim; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(qv, LoadRow8(k[j], f16, i), acc[j]);
  }
  HWY_ALIGN float sums[8];
  _mm256_store_ps(sums, ReduceEight(acc));
  for (int j = 0; j < N; ++j) scores[j] = sums[j] * scale;
}

// out[j][0, head_dim) = Σ_{p < n_pos[j]} e[j][p] · v_p, accumulated in position
// order (n_pos non-decreasing in j: the rows share positions [0, n_pos[0]), and the
// longer rows go on alone).
template <int N>
HWY_INLINE void GroupWeightedSum(const float* const* e, const void* const* v_rows, bool f16,
                                 const int64_t* n_pos, int64_t head_dim, float* const* out) {
  for (int64_t i = 0; i < head_dim; i += 8) {
    __m256 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p < n_pos[0]; ++p) {
      const __m256 v = LoadRow8(v_rows[p], f16, i);
      for (int j = 0; j < N; ++j)
        acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(e[j] + p), v, acc[j]);
    }
    for (; p < n_pos[N - 1]; ++p) {
      const __m256 v = LoadRow8(v_rows[p], f16, i);
      for (int j = 0; j < N; ++j) {
        if (p < n_pos[j]) acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(e[j] + p), v, acc[j]);
      }
    }
    for (int j = 0; j < N; ++j) _mm256_storeu_ps(out[j] + i, acc[j]);
  }
}

// GroupWeightedSum<1> with positions outermost: 64 dims of accumulators stay in
// registers and each weight is broadcast once per position. Every output element
// accumulates the same FMAs in the same position order, so the bits are equal.
HWY_INLINE void WeightedSumOne(const float* e, const void* const* v_rows, bool f16, int64_t n_pos,
                               int64_t head_dim, float* out) {
  for (int64_t i0 = 0; i0 < head_dim; i0 += 64) {
    const int chunks = static_cast<int>(std::min<int64_t>(8, (head_dim - i0) / 8));
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t p = 0; p < n_pos; ++p) {
      const __m256 w = _mm256_broadcast_ss(e + p);
      for (int c = 0; c < chunks; ++c) {
        acc[c] = _mm256_fmadd_ps(w, LoadRow8(v_rows[p], f16, i0 + 8 * c), acc[c]);
      }
    }
    for (int c = 0; c < chunks; ++c) _mm256_storeu_ps(out + i0 + 8 * c, acc[c]);
  }
}

#if TESSERA_ATTN_AVX512
// AVX-512: the same per-row arithmetic as the 8-lane helpers above, twice as wide.

// Rows this far ahead are prefetched (8 KiB of f16 rows of 64: four blocks, each a
// run of its own for the prefetchers): a decode step reads its K and V rows from
// memory once each. kernels_bench's BM_AttentionDecode (caches cycled, as a
// model's layers are), one Zen 5 core, MHA 12 heads: 16 rows 12.9–14.7 GB/s, 64
// rows 15.3–16.9, 256 rows 13.3–15.6 (two alternating rounds).
constexpr int64_t kPrefetchRows = 64;

// Prefetches dims [i0, i0 + 64) of a K/V row: what a 64-dim pass over the rows reads
// (a head_dim of 128 makes two passes, each over the whole context).
HWY_INLINE void PrefetchDims64(const void* row, int64_t i0, bool f16) {
  const int64_t elem = f16 ? 2 : 4;
  PrefetchLines(static_cast<const uint8_t*>(row) + i0 * elem, 64 * elem);
}

// Query rows [0, n) as pairs for PairDots: [pair][head_dim / 8 chunks][16 floats],
// row 2i's 8 floats of the chunk, then row 2i + 1's (zeros past row n).
template <class RowFn>
void PackRowPairs(int64_t n, int64_t head_dim, RowFn&& row, std::vector<float>& packed) {
  const int64_t chunks = head_dim / 8, pairs = (n + 1) / 2;
  packed.assign(static_cast<size_t>(pairs * chunks * 16), 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* src = row(r);
    float* dst = packed.data() + (r / 2) * chunks * 16 + (r % 2) * 8;
    for (int64_t c = 0; c < chunks; ++c) std::memcpy(dst + c * 16, src + c * 8, 8 * sizeof(float));
  }
}

// GroupDots for P row pairs packed by PackRowPairs: one 512-bit register holds two
// rows' 8-lane accumulators, each half the same FMA chain as GroupDots' register for
// its row, then the same ReduceEight tree: the same bits, half the instructions.
template <int P>
HWY_INLINE void PairDots(const float* packed, const void* k, bool f16, int64_t head_dim,
                         float scale, float* scores) {
  const int64_t chunks = head_dim / 8;
  __m512 acc[P];
  for (int i = 0; i < P; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512 kv = _mm512_broadcast_f32x8(LoadRow8(k, f16, 8 * c));
    for (int i = 0; i < P; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(packed + (i * chunks + c) * 16), kv, acc[i]);
    }
  }
  __m256 rows[8];
  for (int i = 0; i < 4; ++i) {
    rows[2 * i] = i < P ? _mm512_castps512_ps256(acc[i]) : _mm256_setzero_ps();
    rows[2 * i + 1] = i < P ? _mm512_extractf32x8_ps(acc[i], 1) : _mm256_setzero_ps();
  }
  HWY_ALIGN float sums[8];
  _mm256_store_ps(sums, ReduceEight(rows));
  for (int j = 0; j < 2 * P; ++j) scores[j] = sums[j] * scale;
}

HWY_INLINE __m512 LoadRow16(const void* row, bool f16, int64_t i) {
  if (f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i)));
  }
  return _mm512_loadu_ps(static_cast<const float*>(row) + i);
}

// GroupWeightedSum for N <= 4 rows and head_dim % 64 == 0, positions outermost: 64
// dims of each row's accumulators stay in registers and each V row is loaded once
// per 64 dims. Every output element accumulates the same FMAs in the same position
// order, so the bits are GroupWeightedSum's.
template <int N>
HWY_INLINE void WeightedSumRows(const float* const* e, const void* const* v_rows, bool f16,
                                const int64_t* n_pos, int64_t head_dim, float* const* out) {
  for (int64_t i0 = 0; i0 < head_dim; i0 += 64) {
    __m512 acc[N][4];
    for (int j = 0; j < N; ++j) {
      for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_setzero_ps();
    }
    int64_t p = 0;
    for (; p < n_pos[0]; ++p) {
      if (p + kPrefetchRows < n_pos[N - 1]) PrefetchDims64(v_rows[p + kPrefetchRows], i0, f16);
      __m512 v[4];
      for (int c = 0; c < 4; ++c) v[c] = LoadRow16(v_rows[p], f16, i0 + 16 * c);
      for (int j = 0; j < N; ++j) {
        const __m512 w = _mm512_set1_ps(e[j][p]);
        for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_fmadd_ps(w, v[c], acc[j][c]);
      }
    }
    for (; p < n_pos[N - 1]; ++p) {  // the longer rows go on alone
      __m512 v[4];
      for (int c = 0; c < 4; ++c) v[c] = LoadRow16(v_rows[p], f16, i0 + 16 * c);
      for (int j = 0; j < N; ++j) {
        if (p >= n_pos[j]) continue;
        const __m512 w = _mm512_set1_ps(e[j][p]);
        for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_fmadd_ps(w, v[c], acc[j][c]);
      }
    }
    for (int j = 0; j < N; ++j) {
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out[j] + i0 + 16 * c, acc[j][c]);
    }
  }
}
#endif  // TESSERA_ATTN_AVX512

// fn(std::integral_constant<int, n>()) for n in [1, kMax] (a larger n as kMax): a
// run-time count of rows made a compile-time one, so tiles keep their accumulators
// in registers.
template <int kMax, class Fn>
HWY_INLINE void WithCount(int64_t n, Fn&& fn) {
  if constexpr (kMax > 1) {
    if (n < kMax) return WithCount<kMax - 1>(n, fn);
  }
  fn(std::integral_constant<int, kMax>());
}

HWY_INLINE void PositionDots(const float* q, const void* const* k, int n, bool f16,
                             int64_t head_dim, float scale, float* scores) {
  WithCount<8>(
      n, [&](auto kN) { PositionDotsN<decltype(kN)::value>(q, k, f16, head_dim, scale, scores); });
}

// Where positions [lo, len) of KV head h live (entry p of the arrays; those below lo
// are left alone): block by block, consecutive rows within a block (no division per
// position). `v_rows` may be null.
void RowPointers(const PagedKv& kv, const int32_t* table, int64_t h, int64_t lo, int64_t len,
                 const void** k_rows, const void** v_rows) {
  const KvLayout& layout = kv.layout;
  const int64_t row_stride = layout.head_dim * layout.ElemBytes();
  for (int64_t b = lo / layout.block_size, p = lo; p < len; ++b) {
    const int64_t first = layout.RowIndex(table[b], 0, h) * layout.ElemBytes();
    const uint8_t* k = static_cast<const uint8_t*>(kv.k) + first;
    const uint8_t* v = static_cast<const uint8_t*>(kv.v) + first;
    for (int64_t s = p % layout.block_size; s < layout.block_size && p < len; ++s, ++p) {
      k_rows[p] = k + s * row_stride;
      if (v_rows != nullptr) v_rows[p] = v + s * row_stride;
    }
  }
}

// Rows are (query, head) pairs, row = (qi - q_begin) · group + g, taken 8 at a time
// whatever the group size (8 independent accumulators; MHA has group 1).
// With `partials`, one query's spans [first_span, first_span + n_spans) are written
// there instead (positions below them are neither read nor scored).
void AttendGroupX86(const PagedKv& kv, const int32_t* table, const float* q, int64_t n_heads,
                    int64_t pos0, int64_t q_begin, int64_t q_end, int64_t h, float* out,
                    const SpanPartials* partials) {
  const KvLayout& layout = kv.layout;
  const int64_t head_dim = layout.head_dim;
  const int64_t group = n_heads / layout.n_kv_heads;
  const int64_t len = pos0 + q_end;
  const bool f16 = layout.type == KvType::kF16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const DF df;
  const int64_t lo = partials != nullptr ? partials->first_span * layout.span : 0;
  std::vector<const void*> k_rows(len), v_rows(len);
  RowPointers(kv, table, h, lo, len, k_rows.data(), v_rows.data());
  const int64_t n_rows = (q_end - q_begin) * group;
  std::vector<float> scores(n_rows * len);
  auto query_of = [&](int64_t row) { return q_begin + row / group; };
  auto head_of = [&](int64_t row) { return h * group + row % group; };
  if (n_rows == 1) {  // one query of one head reads every position: 8 positions a pass
    const float* q_row = q + (query_of(0) * n_heads + head_of(0)) * head_dim;
    for (int64_t p = lo; p < len; p += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, len - p));
      PositionDots(q_row, k_rows.data() + p, n, f16, head_dim, scale, scores.data() + p);
    }
  }
#if TESSERA_ATTN_AVX512
  if (n_rows > 1) {
    // Rows in pairs (PairDots: GroupDots' bits); a pair whose first row cannot see p yet is scored
    // and dropped.
    std::vector<float> packed;
    PackRowPairs(
        n_rows, head_dim,
        [&](int64_t row) { return q + (query_of(row) * n_heads + head_of(row)) * head_dim; },
        packed);
    const int64_t pair_floats = head_dim / 8 * 16;
    for (int64_t p = lo; p < len; ++p) {
      if (p + kPrefetchRows < len) {
        PrefetchLines(k_rows[p + kPrefetchRows], head_dim * layout.ElemBytes());
      }
      const int64_t first_row = (std::max(q_begin, p - pos0) - q_begin) * group;
      for (int64_t r0 = first_row & ~int64_t{1}; r0 < n_rows; r0 += 8) {
        const float* pairs = packed.data() + r0 / 2 * pair_floats;
        float dots[8];
        WithCount<4>((n_rows - r0 + 1) / 2, [&](auto kP) {
          PairDots<decltype(kP)::value>(pairs, k_rows[p], f16, head_dim, scale, dots);
        });
        const int64_t r_end = std::min<int64_t>(r0 + 8, n_rows);
        for (int64_t r = std::max(r0, first_row); r < r_end; ++r)
          scores[r * len + p] = dots[r - r0];
      }
    }
  }
#else
  for (int64_t p = lo; p < len && n_rows > 1; ++p) {
    const int64_t first_row = (std::max(q_begin, p - pos0) - q_begin) * group;
    for (int64_t r0 = first_row; r0 < n_rows; r0 += 8) {
      const int64_t n = std::min<int64_t>(8, n_rows - r0);
      const float* qs[8];
      for (int64_t j = 0; j < n; ++j) {
        qs[j] = q + (query_of(r0 + j) * n_heads + head_of(r0 + j)) * head_dim;
      }
      float dots[8];
      WithCount<8>(n, [&](auto kN) {
        GroupDots<decltype(kN)::value>(qs, k_rows[p], f16, head_dim, scale, dots);
      });
      for (int64_t j = 0; j < n; ++j) scores[(r0 + j) * len + p] = dots[j];
    }
  }
#endif
  const int64_t span = layout.span;
  std::vector<float> part(8 * head_dim);  // later spans' weighted sums, before the fold
  for (int64_t r0 = 0; r0 < n_rows; r0 += 8) {
    const int64_t n = std::min<int64_t>(8, n_rows - r0);
    float* o[8];
    int64_t n_pos[8];
    SpanFold fold[8];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = r0 + j;
      n_pos[j] = pos0 + query_of(row) + 1;
      o[j] =
          partials != nullptr ? nullptr : out + (query_of(row) * n_heads + head_of(row)) * head_dim;
    }
    // Span by span; the rows that see any of span k are a suffix [first, n) of the tile
    // (n_pos grows with j), each seeing a prefix of it.
    for (int64_t k = lo / span, begin = lo; begin < n_pos[n - 1]; ++k, begin += span) {
      int64_t first = 0;
      while (n_pos[first] <= begin) ++first;
      const int64_t m = n - first;
      const float* e[8];
      float* sums[8];
      int64_t count[8];
      float span_max[8], span_sum[8];
      for (int64_t j = 0; j < m; ++j) {
        const int64_t row = r0 + first + j;
        count[j] = std::min(span, n_pos[first + j] - begin);
        float* s_row = scores.data() + row * len + begin;
        span_sum[j] = ExpSpan(df, s_row, count[j], &span_max[j]);
        e[j] = s_row;
        sums[j] = partials != nullptr ? partials->Out(k, head_of(row), head_dim)
                  : k == 0            ? o[first + j]
                                      : part.data() + j * head_dim;
      }
      const void* const* v = v_rows.data() + begin;
      if (m == 1) {
        WeightedSumOne(e[0], v, f16, count[0], head_dim, sums[0]);
#if TESSERA_ATTN_AVX512
      } else if (head_dim % 64 == 0) {
        for (int64_t j0 = 0; j0 < m; j0 += 4) {
          WithCount<4>(m - j0, [&](auto kN) {
            WeightedSumRows<decltype(kN)::value>(e + j0, v, f16, count + j0, head_dim, sums + j0);
          });
        }
#endif
      } else {
        WithCount<8>(m, [&](auto kN) {
          GroupWeightedSum<decltype(kN)::value>(e, v, f16, count, head_dim, sums);
        });
      }
      for (int64_t j = 0; j < m; ++j) {
        if (partials != nullptr) {
          partials->Set(k, head_of(r0 + first + j), span_max[j], span_sum[j]);
        } else {
          fold[first + j].Add(k, span_max[j], span_sum[j], sums[j], o[first + j], head_dim);
        }
      }
    }
    if (partials == nullptr) {
      for (int64_t j = 0; j < n; ++j) fold[j].Finish(o[j], head_dim);
    }
  }
}
#if TESSERA_ATTN_AVX512
// Decode of KV heads h and h + 1 of a model without grouped heads (one query at
// `pos`, head_dim % 64 == 0). Each head's scores and softmax are the lone row's of
// AttendGroupX86; the two weighted sums share one pass over the positions, 16 dims a
// register: 8 accumulator chains where one head alone has 4 (a chain waits on the
// FMA's latency at every position). Each lane is WeightedSumOne's chain, so the same
// bits.
void AttendHeadPairX86(const PagedKv& kv, const int32_t* table, const float* q, int64_t pos,
                       int64_t h, float* out) {
  const KvLayout& layout = kv.layout;
  const int64_t head_dim = layout.head_dim, len = pos + 1;
  const bool f16 = layout.type == KvType::kF16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const DF df;
  const int64_t head_bytes = head_dim * layout.ElemBytes();
  // K and V rows of head h, then of h + 1.
  std::vector<const void*> k_rows(2 * len), v_rows(2 * len);
  RowPointers(kv, table, h, 0, len, k_rows.data(), v_rows.data());
  RowPointers(kv, table, h + 1, 0, len, k_rows.data() + len, v_rows.data() + len);
  const void* const* v0 = v_rows.data();
  const void* const* v1 = v_rows.data() + len;
  std::vector<float> scores(2 * len);
  for (int64_t i = 0; i < 2; ++i) {
    const float* q_row = q + (h + i) * head_dim;
    const void* const* rows = k_rows.data() + i * len;
    for (int64_t p = 0; p < len; p += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, len - p));
      for (int64_t a = p + kPrefetchRows; a < std::min(len, p + kPrefetchRows + 8); ++a) {
        PrefetchLines(rows[a], head_bytes);
      }
      PositionDots(q_row, rows + p, n, f16, head_dim, scale, scores.data() + i * len + p);
    }
  }
  float* o0 = out + h * head_dim;
  float* o1 = out + (h + 1) * head_dim;
  std::vector<float> part(2 * head_dim);  // later spans' weighted sums, before the fold
  SpanFold fold[2];
  for (int64_t k = 0, begin = 0; begin < len; ++k, begin += kv.layout.span) {
    const int64_t end = std::min(len, begin + kv.layout.span);
    float span_max[2], span_sum[2];
    for (int64_t i = 0; i < 2; ++i) {
      span_sum[i] = ExpSpan(df, scores.data() + i * len + begin, end - begin, &span_max[i]);
    }
    float* s0 = k == 0 ? o0 : part.data();
    float* s1 = k == 0 ? o1 : part.data() + head_dim;
    const float* e0 = scores.data();
    const float* e1 = scores.data() + len;
    for (int64_t i0 = 0; i0 < head_dim; i0 += 64) {
      __m512 a0[4], a1[4];
      for (int c = 0; c < 4; ++c) a0[c] = a1[c] = _mm512_setzero_ps();
      for (int64_t p = begin; p < end; ++p) {
        if (p + kPrefetchRows < len) {
          PrefetchDims64(v0[p + kPrefetchRows], i0, f16);
          PrefetchDims64(v1[p + kPrefetchRows], i0, f16);
        }
        const __m512 w0 = _mm512_set1_ps(e0[p]), w1 = _mm512_set1_ps(e1[p]);
        for (int c = 0; c < 4; ++c) {
          a0[c] = _mm512_fmadd_ps(w0, LoadRow16(v0[p], f16, i0 + 16 * c), a0[c]);
          a1[c] = _mm512_fmadd_ps(w1, LoadRow16(v1[p], f16, i0 + 16 * c), a1[c]);
        }
      }
      for (int c = 0; c < 4; ++c) {
        _mm512_storeu_ps(s0 + i0 + 16 * c, a0[c]);
        _mm512_storeu_ps(s1 + i0 + 16 * c, a1[c]);
      }
    }
    fold[0].Add(k, span_max[0], span_sum[0], s0, o0, head_dim);
    fold[1].Add(k, span_max[1], span_sum[1], s1, o1, head_dim);
  }
  fold[0].Finish(o0, head_dim);
  fold[1].Finish(o1, head_dim);
}
#endif  // TESSERA_ATTN_AVX512
#endif  // TESSERA_ATTN_X86

// Queries [q_begin, q_end) of the batch, KV head h, all heads of its group.
// With `partials`, one query's spans [first_span, first_span + n_spans) are written
// there instead of folded into out.
void AttendGroupImpl(const PagedKv& kv, const int32_t* table, const float* q, int64_t n_heads,
                     int64_t pos0, int64_t q_begin, int64_t q_end, int64_t h, float* out,
                     const SpanPartials* partials) {
#if TESSERA_ATTN_X86
  if (kv.layout.head_dim % 8 == 0) {
    AttendGroupX86(kv, table, q, n_heads, pos0, q_begin, q_end, h, out, partials);
    return;
  }
#endif
  const DF df;
  const KvLayout& layout = kv.layout;
  const int64_t head_dim = layout.head_dim;
  const int64_t group = n_heads / layout.n_kv_heads;
  const int64_t n_rows = (q_end - q_begin) * group;  // (query, head) pairs
  const int64_t len = pos0 + q_end;                  // positions any query here reads
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scores(n_rows * len);
  std::vector<float> row_buf(head_dim);
  std::vector<float> part(n_rows * head_dim);  // later spans' weighted sums, before the fold
  std::vector<SpanFold> fold(n_rows);
  auto q_row = [&](int64_t qi, int64_t g) { return q + (qi * n_heads + h * group + g) * head_dim; };
  auto out_row = [&](int64_t qi, int64_t g) {
    return out + (qi * n_heads + h * group + g) * head_dim;
  };

  const int64_t lo = partials != nullptr ? partials->first_span * layout.span : 0;
  for (int64_t p = lo; p < len; ++p) {
    const float* k = KvRow(layout, kv.k, table, p, h, row_buf.data());
    for (int64_t qi = std::max(q_begin, p - pos0); qi < q_end; ++qi) {
      for (int64_t g = 0; g < group; ++g) {
        scores[((qi - q_begin) * group + g) * len + p] = Dot(df, q_row(qi, g), k, head_dim) * scale;
      }
    }
  }
  // Span by span: the queries that see any of it are [std::max(q_begin, begin - pos0), q_end).
  for (int64_t k = lo / layout.span, begin = lo; begin < len; ++k, begin += layout.span) {
    const int64_t end = std::min(len, begin + layout.span);
    const int64_t q_first = std::max(q_begin, begin - pos0);
    auto sums_of = [&](int64_t qi, int64_t g) {
      if (partials != nullptr) return partials->Out(k, h * group + g, head_dim);
      return k == 0 ? out_row(qi, g) : part.data() + ((qi - q_begin) * group + g) * head_dim;
    };
    std::vector<float> span_max(n_rows), span_sum(n_rows);
    for (int64_t qi = q_first; qi < q_end; ++qi) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t row = (qi - q_begin) * group + g;
        const int64_t count = std::min(end, pos0 + qi + 1) - begin;
        span_sum[row] = ExpSpan(df, scores.data() + row * len + begin, count, &span_max[row]);
        std::fill(sums_of(qi, g), sums_of(qi, g) + head_dim, 0.0f);
      }
    }
    for (int64_t p = begin; p < end; ++p) {
      const float* v = KvRow(layout, kv.v, table, p, h, row_buf.data());
      for (int64_t qi = std::max(q_first, p - pos0); qi < q_end; ++qi) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t row = (qi - q_begin) * group + g;
          Axpy(df, scores[row * len + p], v, sums_of(qi, g), head_dim);
        }
      }
    }
    for (int64_t qi = q_first; qi < q_end; ++qi) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t row = (qi - q_begin) * group + g;
        if (partials != nullptr) {
          partials->Set(k, h * group + g, span_max[row], span_sum[row]);
        } else {
          fold[row].Add(k, span_max[row], span_sum[row], sums_of(qi, g), out_row(qi, g), head_dim);
        }
      }
    }
  }
  for (int64_t qi = q_begin; qi < q_end && partials == nullptr; ++qi) {
    for (int64_t g = 0; g < group; ++g) {
      fold[(qi - q_begin) * group + g].Finish(out_row(qi, g), head_dim);
    }
  }
}

// One query at `pos` against KV heads [h_begin, h_end) of a model without grouped
// heads: two at a time where the target can (AttendHeadPairX86), else one by one.
void AttendLoneHeadsImpl(const PagedKv& kv, const int32_t* table, const float* q, int64_t n_heads,
                         int64_t pos, int64_t h_begin, int64_t h_end, float* out) {
  int64_t h = h_begin;
#if TESSERA_ATTN_AVX512
  if (kv.layout.head_dim % 64 == 0) {
    for (; h + 2 <= h_end; h += 2) AttendHeadPairX86(kv, table, q, pos, h, out);
  }
#endif
  for (; h < h_end; ++h) AttendGroupImpl(kv, table, q, n_heads, pos, 0, 1, h, out, nullptr);
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {
namespace {

// Queries per work item: enough to amortise each K/V row load, small enough that
// the scores of a tile stay in cache.
constexpr int64_t kQueryTile = 16;

// Positions [first_pos, last_pos] are read: their table entries must be blocks.
void CheckArgs(const PagedKv& kv, std::span<const int32_t> table, int64_t n_heads, int64_t last_pos,
               int64_t first_pos = 0) {
  const KvLayout& l = kv.layout;
  TESSERA_CHECK(l.block_size > 0 && l.n_kv_heads > 0 && l.head_dim > 0);
  TESSERA_CHECK(n_heads > 0 && n_heads % l.n_kv_heads == 0)
      << n_heads << " heads vs " << l.n_kv_heads << " kv heads";
  const int64_t blocks_needed = last_pos / l.block_size + 1;
  TESSERA_CHECK(l.span > 0) << "attention span " << l.span;
  TESSERA_CHECK_GE(static_cast<int64_t>(table.size()), blocks_needed);
  for (int64_t i = first_pos / l.block_size; i < blocks_needed; ++i) {
    TESSERA_CHECK(table[i] >= 0 && table[i] < kv.n_blocks)
        << "block table entry " << i << " = " << table[i] << " of " << kv.n_blocks;
  }
}

}  // namespace

HWY_EXPORT(AttendGroupImpl);
HWY_EXPORT(AttendLoneHeadsImpl);

void StoreKv(const KvLayout& layout, std::span<const int32_t> block_table, int64_t pos,
             const float* k, const float* v, void* k_pool, void* v_pool) {
  TESSERA_CHECK(pos >= 0 && pos / layout.block_size < static_cast<int64_t>(block_table.size()));
  const int64_t block = block_table[pos / layout.block_size];
  const int64_t n = layout.head_dim;
  for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
    const int64_t index = layout.RowIndex(block, pos % layout.block_size, h);
    const float* kh = k + h * n;
    const float* vh = v + h * n;
    if (layout.type == KvType::kF32) {
      std::memcpy(static_cast<float*>(k_pool) + index, kh, n * sizeof(float));
      std::memcpy(static_cast<float*>(v_pool) + index, vh, n * sizeof(float));
      continue;
    }
    F32ToF16Row(kh, static_cast<uint16_t*>(k_pool) + index, static_cast<size_t>(n));
    F32ToF16Row(vh, static_cast<uint16_t*>(v_pool) + index, static_cast<size_t>(n));
  }
}

void KvHeadToF16(const float* in, uint16_t* out, int64_t n) {
  F32ToF16Row(in, out, static_cast<size_t>(n));
}

void StoreKvF16(const KvLayout& layout, std::span<const int32_t> block_table, int64_t pos,
                const uint16_t* k, const uint16_t* v, void* k_pool, void* v_pool) {
  TESSERA_CHECK(layout.type == KvType::kF16);
  TESSERA_CHECK(pos >= 0 && pos / layout.block_size < static_cast<int64_t>(block_table.size()));
  const int64_t block = block_table[pos / layout.block_size];
  const int64_t n = layout.head_dim;
  for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
    const int64_t index = layout.RowIndex(block, pos % layout.block_size, h);
    std::memcpy(static_cast<uint16_t*>(k_pool) + index, k + h * n, n * sizeof(uint16_t));
    std::memcpy(static_cast<uint16_t*>(v_pool) + index, v + h * n, n * sizeof(uint16_t));
  }
}

void AttentionMulti(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
                    int64_t n_heads, int64_t pos0, int64_t n_queries, float* out,
                    ThreadPool* pool) {
  if (n_queries <= 0) return;
  TESSERA_CHECK_GE(pos0, 0);
  CheckArgs(kv, block_table, n_heads, pos0 + n_queries - 1);
  const int64_t n_kv = kv.layout.n_kv_heads;
  if (n_queries == 1 && n_heads == n_kv) {
    // Decode without grouped heads: each thread a run of KV heads, which the target
    // may take two at a time (AttendLoneHeadsImpl).
    auto heads = [&](int64_t begin, int64_t end) {
      HWY_DYNAMIC_DISPATCH(AttendLoneHeadsImpl)
      (kv, block_table.data(), q, n_heads, pos0, begin, end, out);
    };
    if (pool == nullptr) {
      heads(0, n_kv);
    } else {
      pool->ParallelFor(n_kv, heads);
    }
    return;
  }
  const int64_t tiles = (n_queries + kQueryTile - 1) / kQueryTile;
  // Causal: a later query tile reads more positions. Items run through the tiles
  // from both ends alternately (first, last, second, second-to-last, …), so every
  // thread's contiguous share of them costs about the same.
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % n_kv, k = item / n_kv;
      const int64_t tile = k % 2 == 0 ? k / 2 : tiles - 1 - k / 2;
      const int64_t q_begin = tile * kQueryTile;
      const int64_t q_end = std::min(n_queries, q_begin + kQueryTile);
      HWY_DYNAMIC_DISPATCH(AttendGroupImpl)
      (kv, block_table.data(), q, n_heads, pos0, q_begin, q_end, h, out, nullptr);
    }
  };
  if (pool == nullptr) {
    run(0, tiles * n_kv);
  } else {
    pool->ParallelFor(tiles * n_kv, run);
  }
}

void Attention(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
               int64_t n_heads, int64_t pos, float* out, ThreadPool* pool) {
  AttentionMulti(kv, block_table, q, n_heads, pos, 1, out, pool);
}

void AttentionSpanPartials(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
                           int64_t n_heads, int64_t pos, const SpanPartials& partials,
                           ThreadPool* pool) {
  const int64_t span = kv.layout.span;
  TESSERA_CHECK(partials.first_span >= 0 && partials.n_spans > 0 &&
                (partials.first_span + partials.n_spans - 1) * span <= pos)
      << "spans [" << partials.first_span << ", " << partials.first_span + partials.n_spans
      << ") of a query at position " << pos;
  const int64_t end = std::min(pos + 1, (partials.first_span + partials.n_spans) * span);
  CheckArgs(kv, block_table, n_heads, end - 1, partials.first_span * span);
  // The query's view ends with the last span asked for: a query at end - 1 sees the
  // same positions of those spans as one at pos.
  auto heads = [&](int64_t begin, int64_t finish) {
    for (int64_t h = begin; h < finish; ++h) {
      HWY_DYNAMIC_DISPATCH(AttendGroupImpl)
      (kv, block_table.data(), q, n_heads, end - 1, 0, 1, h, nullptr, &partials);
    }
  };
  if (pool == nullptr) {
    heads(0, kv.layout.n_kv_heads);
  } else {
    pool->ParallelFor(kv.layout.n_kv_heads, heads);
  }
}

void FoldAttentionPartials(const SpanPartials& partials, int64_t n_heads, int64_t head_dim,
                           float* out) {
  for (int64_t hq = 0; hq < n_heads; ++hq) {
    float* o = out + hq * head_dim;
    const int64_t first = partials.first_span;
    std::copy_n(partials.Out(first, hq, head_dim), head_dim, o);
    float max = partials.max[hq], sum = partials.sum[hq];
    for (int64_t k = first + 1; k < first + partials.n_spans; ++k) {
      const int64_t i = (k - first) * partials.n_heads + hq;
      FoldAttentionSpan(max, sum, o, partials.max[i], partials.sum[i],
                        partials.Out(k, hq, head_dim), head_dim);
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
