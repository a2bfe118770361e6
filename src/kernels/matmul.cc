#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/matmul_internal.h"
#include "kernels/quantize.h"

namespace tessera::kernels {
namespace {

bool IsQuantised(WeightType type) { return TraitsOf(type).block_elems > 1; }
bool IsFloat(WeightType type) {
  return type == WeightType::kF32 || type == WeightType::kF16 || type == WeightType::kBF16;
}

// Rows handed to one thread at a time: a multiple of the row tile (4).
constexpr int64_t kRowGrain = 16;
// Threads' row ranges start on whole groups of interleaved rows (kInterleaved8).
static_assert(kRowGrain % kGroupRows == 0);
constexpr int64_t kMinParallelMacs = int64_t{1} << 16;

// Whether MatMul splits the rows over the pool (waking it costs microseconds, so
// tiny products run on the caller; the result is the same either way).
bool SplitsOverPool(const WeightView& w, int64_t n_tokens, const ThreadPool* pool) {
  return pool != nullptr && w.rows * w.cols * n_tokens >= kMinParallelMacs;
}

// The types the kInterleaved8 layout holds: float types, the block-scaled ones with
// one f16 scale per 32-element block, Q4_K and Q6_K.
bool InterleavedType(WeightType type) {
  return IsFloat(type) || type == WeightType::kQ8_0 || type == WeightType::kQ4_0 ||
         type == WeightType::kQ4_K || type == WeightType::kQ6_K;
}

// Super-block b of the 8 rows at `rows` (Q4_K, GGUF layout, `row_bytes` apart) into
// `out`, the group's super-block in the kInterleaved8 layout (matmul.h).
void PackQ4KGroupSuper(const uint8_t* rows, int64_t row_bytes, int64_t b, uint8_t* out) {
  const int64_t super_bytes = TraitsOf(WeightType::kQ4_K).block_bytes;
  for (int64_t r = 0; r < 8; ++r) {
    const uint8_t* src = rows + r * row_bytes + b * super_bytes;
    std::memcpy(out + kQ4KGroupD + 2 * r, src, 2);
    std::memcpy(out + kQ4KGroupDMin + 2 * r, src + 2, 2);
    for (int s = 0; s < 8; ++s) {
      Q4KScaleMin(s, src + kQ4KScalesOffset, &out[kQ4KGroupScales + 8 * s + r],
                  &out[kQ4KGroupMins + 8 * s + r]);
    }
    for (int64_t i = 0; i < 32; ++i) {  // 4-byte unit i of 128: pair i / 8, chunk i % 8
      std::memcpy(out + kQ4KGroupQuants + 32 * i + 4 * r, src + kQ4KQsOffset + 4 * i, 4);
    }
  }
}

// The same for Q6_K: the 8 rows' d and 16 int8 scales (scale g of row r at 8g + r),
// then per half n of the super-block and chunk c (0..7) 96 bytes: bytes [4c, 4c + 4)
// of the half's first and second 32 ql bytes and of its 32 qh bytes, of each row.
void PackQ6KGroupSuper(const uint8_t* rows, int64_t row_bytes, int64_t b, uint8_t* out) {
  const int64_t super_bytes = TraitsOf(WeightType::kQ6_K).block_bytes;
  for (int64_t r = 0; r < 8; ++r) {
    const uint8_t* src = rows + r * row_bytes + b * super_bytes;
    std::memcpy(out + kQ6KGroupD + 2 * r, src + kQ6KDOffset, 2);
    for (int64_t g = 0; g < 16; ++g) out[kQ6KGroupScales + 8 * g + r] = src[kQ6KScalesOffset + g];
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t c = 0; c < 8; ++c) {
        uint8_t* chunk = out + kQ6KGroupQuants + 768 * n + 96 * c + 4 * r;
        std::memcpy(chunk, src + 64 * n + 4 * c, 4);
        std::memcpy(chunk + 32, src + 64 * n + 32 + 4 * c, 4);
        std::memcpy(chunk + 64, src + kQ6KQhOffset + 32 * n + 4 * c, 4);
      }
    }
  }
}

}  // namespace

int64_t KChunkGranularity(WeightType type) {
  const int64_t block = TraitsOf(type).block_elems;
  return block == 1 ? 1 : std::max<int64_t>(block, 32);
}

int CanonicalKChunks(WeightType type, int64_t cols) {
  const int64_t g = KChunkGranularity(type);
  for (int chunks : {8, 4, 2}) {
    if (cols % (chunks * g) == 0) return chunks;
  }
  return 1;
}

WeightView ColumnShard(const WeightView& w, int64_t col_begin, int64_t col_end) {
  TESSERA_CHECK(w.layout == WeightLayout::kRows) << "column shard of an interleaved matrix";
  const int64_t g = KChunkGranularity(w.type);
  TESSERA_CHECK(0 <= col_begin && col_begin < col_end && col_end <= w.cols)
      << col_begin << ".." << col_end << " of " << w.cols;
  TESSERA_CHECK(col_begin % g == 0 && col_end % g == 0)
      << "shard " << col_begin << ".." << col_end << " splits a " << g << "-element block";
  WeightView shard = w;
  shard.data = w.data + *RowBytes(w.type, col_begin);
  shard.cols = col_end - col_begin;
  return shard;
}

bool CanInterleave8(const WeightView& w) {
  return InterleavedType(w.type) && w.layout == WeightLayout::kRows && w.rows % 8 == 0;
}

int64_t Interleaved8RowBytes(WeightType type, int64_t cols) {
  if (type == WeightType::kQ4_K) return cols / 256 * (kQ4KGroupSuperBytes / 8);
  return *RowBytes(type, cols);
}

namespace {

#if defined(__SSE2__)
// Columns [k, k + 8) of 8 rows of 16-bit elements: 8 × 16 bytes in, column after column
// out (16 bytes each: the 8 rows' elements).
void Transpose8x8Halves(const uint8_t* const* rows, int64_t k, uint8_t* out) {
  __m128i r[8];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + 2 * k));
  const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  const __m128i c[8] = {_mm_unpacklo_epi64(b0, b4), _mm_unpackhi_epi64(b0, b4),
                        _mm_unpacklo_epi64(b1, b5), _mm_unpackhi_epi64(b1, b5),
                        _mm_unpacklo_epi64(b2, b6), _mm_unpackhi_epi64(b2, b6),
                        _mm_unpacklo_epi64(b3, b7), _mm_unpackhi_epi64(b3, b7)};
  for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * i), c[i]);
}

// Columns [k, k + 4) of 4 rows of f32: 4 × 16 bytes in, 4 columns of 4 out, 32 bytes apart
// (one half of a group's columns).
void Transpose4x4Floats(const uint8_t* const* rows, int64_t k, uint8_t* out) {
  __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(rows[0]) + k);
  __m128 r1 = _mm_loadu_ps(reinterpret_cast<const float*>(rows[1]) + k);
  __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(rows[2]) + k);
  __m128 r3 = _mm_loadu_ps(reinterpret_cast<const float*>(rows[3]) + k);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(reinterpret_cast<float*>(out), r0);
  _mm_storeu_ps(reinterpret_cast<float*>(out + 32), r1);
  _mm_storeu_ps(reinterpret_cast<float*>(out + 64), r2);
  _mm_storeu_ps(reinterpret_cast<float*>(out + 96), r3);
}
#endif

// One group: 8 row pointers (a zero row for padding) into column-major groups.
void PackGroup(const uint8_t* const* rows, int64_t cols, int64_t elem, uint8_t* group) {
  const int64_t column = kGroupRows * elem;
  int64_t k = 0;
#if defined(__SSE2__)
  if (elem == 2) {
    for (; k + 8 <= cols; k += 8) Transpose8x8Halves(rows, k, group + k * column);
  } else {
    for (; k + 4 <= cols; k += 4) {
      Transpose4x4Floats(rows, k, group + k * column);
      Transpose4x4Floats(rows + 4, k, group + k * column + 16);
    }
  }
#endif
  for (; k < cols; ++k) {
    for (int64_t r = 0; r < kGroupRows; ++r) {
      std::memcpy(group + k * column + r * elem, rows[r] + k * elem, static_cast<size_t>(elem));
    }
  }
}

}  // namespace

void PackFloatGroups(const WeightView& w, int64_t row_begin, int64_t row_end, uint8_t* out) {
  const int64_t elem = TraitsOf(w.type).block_bytes;
  for (int64_t g0 = row_begin; g0 < row_end; g0 += kGroupRows) {
    uint8_t* group = out + (g0 - row_begin) * w.cols * elem;
    const uint8_t* rows[kGroupRows];
    for (int64_t r = 0; r < kGroupRows; ++r) {
      rows[r] = w.data + std::min(g0 + r, row_end - 1) * w.row_bytes;
    }
    if (g0 + kGroupRows <= row_end) {
      PackGroup(rows, w.cols, elem, group);
      continue;
    }
    // The tail group: its real rows, zeros after them.
    std::memset(group, 0, static_cast<size_t>(kGroupRows * w.cols * elem));
    for (int64_t r = 0; r < row_end - g0; ++r) {
      for (int64_t k = 0; k < w.cols; ++k) {
        std::memcpy(group + (k * kGroupRows + r) * elem, rows[r] + k * elem,
                    static_cast<size_t>(elem));
      }
    }
  }
}

WeightView Interleave8(const WeightView& w, uint8_t* out) {
  TESSERA_CHECK(CanInterleave8(w)) << TraitsOf(w.type).name << " " << w.rows << "x" << w.cols;
  WeightView view = w;
  view.data = out;
  view.row_bytes = Interleaved8RowBytes(w.type, w.cols);
  view.layout = WeightLayout::kInterleaved8;
  if (IsFloat(w.type)) {
    PackFloatGroups(w, 0, w.rows, out);
    return view;
  }
  if (w.type == WeightType::kQ4_K || w.type == WeightType::kQ6_K) {
    const bool q4 = w.type == WeightType::kQ4_K;
    const int64_t supers = w.cols / 256;
    const int64_t group_super = q4 ? kQ4KGroupSuperBytes : kQ6KGroupSuperBytes;
    for (int64_t g = 0; g < w.rows / 8; ++g) {
      for (int64_t b = 0; b < supers; ++b) {
        uint8_t* dst = out + (g * supers + b) * group_super;
        if (q4) {
          PackQ4KGroupSuper(w.data + 8 * g * w.row_bytes, w.row_bytes, b, dst);
        } else {
          PackQ6KGroupSuper(w.data + 8 * g * w.row_bytes, w.row_bytes, b, dst);
        }
      }
    }
    return view;
  }
  const int64_t block = TraitsOf(w.type).block_bytes, quant_bytes = block - 2;
  const int64_t group_block = 8 * block, nb = w.cols / 32;
  for (int64_t g = 0; g < w.rows / 8; ++g) {
    for (int64_t j = 0; j < nb; ++j) {
      uint8_t* dst = out + (g * nb + j) * group_block;
      for (int64_t r = 0; r < 8; ++r) {
        const uint8_t* src = w.data + (g * 8 + r) * w.row_bytes + j * block;
        std::memcpy(dst + 2 * r, src, 2);
        for (int64_t c = 0; c < quant_bytes / 4; ++c)
          std::memcpy(dst + 16 + 32 * c + 4 * r, src + 2 + 4 * c, 4);
      }
    }
  }
  return view;
}

void GgufRow(const WeightView& w, int64_t r, uint8_t* out) {
  TESSERA_CHECK(0 <= r && r < w.rows) << r << " of " << w.rows;
  const int64_t row_bytes = *RowBytes(w.type, w.cols);
  if (w.layout == WeightLayout::kRows) {
    std::memcpy(out, w.data + r * w.row_bytes, static_cast<size_t>(row_bytes));
    return;
  }
  const int64_t lane = r % 8;
  const uint8_t* group = w.data + (r - lane) * w.row_bytes;
  if (IsFloat(w.type)) {  // column k's 8 elements at [8k, 8k + 8)
    const int64_t elem = TraitsOf(w.type).block_bytes;
    for (int64_t k = 0; k < w.cols; ++k) {
      std::memcpy(out + k * elem, group + (8 * k + lane) * elem, static_cast<size_t>(elem));
    }
    return;
  }
  if (w.type == WeightType::kQ4_K) {
    for (int64_t b = 0; b < w.cols / 256; ++b) {  // PackQ4KGroupSuper backwards
      const uint8_t* sb = group + b * kQ4KGroupSuperBytes;
      uint8_t* dst = out + b * TraitsOf(w.type).block_bytes;
      std::memcpy(dst, sb + kQ4KGroupD + 2 * lane, 2);
      std::memcpy(dst + 2, sb + kQ4KGroupDMin + 2 * lane, 2);
      uint8_t sc[8], m[8];
      for (int s = 0; s < 8; ++s) {
        sc[s] = sb[kQ4KGroupScales + 8 * s + lane];
        m[s] = sb[kQ4KGroupMins + 8 * s + lane];
      }
      uint8_t* scales = dst + kQ4KScalesOffset;  // the 6-bit packing Q4KScaleMin reads
      for (int j = 0; j < 4; ++j) {
        scales[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = static_cast<uint8_t>((m[j] & 63) | (m[j + 4] >> 4) << 6);
        scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
      }
      for (int64_t i = 0; i < 32; ++i) {
        std::memcpy(dst + kQ4KQsOffset + 4 * i, sb + kQ4KGroupQuants + 32 * i + 4 * lane, 4);
      }
    }
    return;
  }
  if (w.type == WeightType::kQ6_K) {
    for (int64_t b = 0; b < w.cols / 256; ++b) {  // PackQ6KGroupSuper backwards
      const uint8_t* sb = group + b * kQ6KGroupSuperBytes;
      uint8_t* dst = out + b * TraitsOf(w.type).block_bytes;
      std::memcpy(dst + kQ6KDOffset, sb + kQ6KGroupD + 2 * lane, 2);
      for (int64_t g = 0; g < 16; ++g)
        dst[kQ6KScalesOffset + g] = sb[kQ6KGroupScales + 8 * g + lane];
      for (int64_t n = 0; n < 2; ++n) {
        for (int64_t c = 0; c < 8; ++c) {
          const uint8_t* chunk = sb + kQ6KGroupQuants + 768 * n + 96 * c + 4 * lane;
          std::memcpy(dst + 64 * n + 4 * c, chunk, 4);
          std::memcpy(dst + 64 * n + 32 + 4 * c, chunk + 32, 4);
          std::memcpy(dst + kQ6KQhOffset + 32 * n + 4 * c, chunk + 64, 4);
        }
      }
    }
    return;
  }
  // Q8_0 / Q4_0: per block the 8 scales, then 32-byte chunks of 4 bytes a row.
  const int64_t block = TraitsOf(w.type).block_bytes, quant_bytes = block - 2;
  for (int64_t j = 0; j < w.cols / 32; ++j) {
    const uint8_t* src = group + j * 8 * block;
    uint8_t* dst = out + j * block;
    std::memcpy(dst, src + 2 * lane, 2);
    for (int64_t c = 0; c < quant_bytes / 4; ++c) {
      std::memcpy(dst + 2 + 4 * c, src + 16 + 32 * c + 4 * lane, 4);
    }
  }
}

WeightView RowShard(const WeightView& w, int64_t row_begin, int64_t row_end) {
  TESSERA_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows)
      << row_begin << ".." << row_end << " of " << w.rows;
  TESSERA_CHECK(w.layout == WeightLayout::kRows || (row_begin % 8 == 0 && row_end % 8 == 0))
      << "rows " << row_begin << ".." << row_end << " split a group of 8 interleaved rows";
  WeightView shard = w;
  shard.data = w.data + row_begin * w.row_bytes;
  shard.rows = row_end - row_begin;
  return shard;
}

float KChunkTreeSum(const float* partials, int lo, int hi) {
  TESSERA_CHECK_LT(lo, hi);
  return TreeSum(partials, lo, hi);
}

namespace {

void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride,
                         Q8Activations* out, ThreadPool* pool) {
  TESSERA_CHECK_EQ(cols % 32, 0);
  out->n_tokens = n_tokens;
  out->cols = cols;
  out->qs.resize(n_tokens * cols);
  out->d.resize(n_tokens * cols / 32);
  out->sum_q.resize(n_tokens * cols / 32);
  out->sum_d.resize(n_tokens * cols / 32);
  if (pool == nullptr) {
    QuantizeQ8Rows(x, x_stride, 0, n_tokens, out);
    return;
  }
  pool->ParallelFor(
      n_tokens, [&](int64_t begin, int64_t end) { QuantizeQ8Rows(x, x_stride, begin, end, out); });
}

}  // namespace

void QuantizeActivationsQ8(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride,
                           Q8Activations* out) {
  QuantizeActivations(x, n_tokens, cols, x_stride, out, nullptr);
}

namespace {

// MatMul's checks of one product and its arguments, x not yet attached.
MatMulArgs CheckedArgs(const WeightView& w, int64_t n_tokens, float* y,
                       const MatMulOptions& options) {
  const int64_t g = KChunkGranularity(w.type);
  const int k_chunks = options.k_chunks > 0 ? options.k_chunks : CanonicalKChunks(w.type, w.cols);
  TESSERA_CHECK(w.cols > 0 && w.rows >= 0) << w.rows << "x" << w.cols;
  TESSERA_CHECK(k_chunks <= kMaxKChunks && w.cols % (k_chunks * g) == 0)
      << "cols " << w.cols << " is not " << k_chunks << " chunks of whole " << g
      << "-element blocks (" << TraitsOf(w.type).name << ")";
  TESSERA_CHECK_GE(w.row_bytes, *RowBytes(w.type, w.cols));
  TESSERA_CHECK(w.layout == WeightLayout::kRows ||
                (InterleavedType(w.type) && w.rows % 8 == 0 &&
                 w.row_bytes == Interleaved8RowBytes(w.type, w.cols)))
      << "interleaved " << TraitsOf(w.type).name << " " << w.rows << "x" << w.cols;
  MatMulArgs args;
  args.w = w;
  args.n_tokens = n_tokens;
  args.x_stride = options.x_stride > 0 ? options.x_stride : w.cols;
  args.y = y;
  args.y_stride = options.y_stride > 0 ? options.y_stride : w.rows;
  args.k_chunks = k_chunks;
  args.chunk_elems = w.cols / k_chunks;
  TESSERA_CHECK(args.x_stride >= w.cols && args.y_stride >= w.rows)
      << "strides " << args.x_stride << "/" << args.y_stride << " for " << w.rows << "x" << w.cols;
  return args;
}

// The rows of a product, to its weight type's kernels.
void ProductRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  if (IsFloat(args.w.type)) {
    MatMulFloatRows(args, row_begin, row_end);
  } else if (args.w.type == WeightType::kQ4_K || args.w.type == WeightType::kQ6_K) {
    MatMulKQuantRows(args, row_begin, row_end);
  } else {
    MatMulBlockScaledRows(args, row_begin, row_end);
  }
}

// A GEMV's pieces for ParallelForBalanced over `rows` rows: each thread's share in
// pieces of about an eighth (whole 64-row tiles), the last ones taken by whichever
// thread is free. On the Zen 5 VM with 2 threads one thread often finished its
// static half a few µs after the other (the caller waited 8% of its time in 1.1B
// Q8_0 decode, 14% in the 110M's); with the pieces, whole generations took 0.95x the
// time (1.1B Q8_0), 0.86x (1.1B F16), 0.98x (110M Q8_0), 0.99x (1.1B Q4_0) (medians
// of 8–12 alternating pairs). Batches keep the static split: 8-sequence decode
// measured the same either way, and their row blocks are sized for L2.
int64_t GemvPiece(int64_t rows, const ThreadPool& pool) {
  return std::clamp<int64_t>(rows / (pool.num_threads() * 8) / 64 * 64, 64, 1024);
}

}  // namespace

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y,
            const MatMulOptions& options, ThreadPool* pool) {
  MatMulArgs args = CheckedArgs(w, n_tokens, y, options);
  if (n_tokens <= 0 || w.rows == 0) return;
  Q8Activations xq;
  if (IsQuantised(w.type)) {
    QuantizeActivations(x, n_tokens, w.cols, args.x_stride, &xq, pool);
    args.xq = &xq;
  } else {
    args.x = x;
  }
  if (!SplitsOverPool(w, n_tokens, pool)) {
    ProductRows(args, 0, w.rows);
    return;
  }
  const auto rows = [&](int64_t begin, int64_t end) { ProductRows(args, begin, end); };
  if (n_tokens == 1) {
    pool->ParallelForBalanced(w.rows, rows, kRowGrain, GemvPiece(w.rows, *pool));
    return;
  }
  pool->ParallelFor(w.rows, rows, kRowGrain);
}

void MatMulShared(std::span<const SharedProduct> products, const float* x, int64_t n_tokens,
                  ThreadPool* pool) {
  if (n_tokens != 1 || pool == nullptr || products.size() <= 1) {
    for (const SharedProduct& p : products) {
      MatMul(p.w, x, n_tokens, p.y, {.k_chunks = p.k_chunks}, pool);
    }
    return;
  }
  // One GEMV job over the products' rows laid end to end, each product starting on
  // a whole grain (so every piece of it starts on a whole group of rows).
  TESSERA_CHECK_LE(products.size(), kMaxSharedProducts);
  MatMulArgs args[kMaxSharedProducts];
  int64_t first_row[kMaxSharedProducts];
  int64_t total = 0, macs = 0;
  const int64_t cols = products[0].w.cols;
  bool quantised = false;
  for (size_t i = 0; i < products.size(); ++i) {
    const SharedProduct& p = products[i];
    TESSERA_CHECK_EQ(p.w.cols, cols) << "products of one input share its columns";
    args[i] = CheckedArgs(p.w, 1, p.y, {.k_chunks = p.k_chunks});
    first_row[i] = total;
    total += (p.w.rows + kRowGrain - 1) / kRowGrain * kRowGrain;
    macs += p.w.rows * cols;
    quantised = quantised || IsQuantised(p.w.type);
  }
  Q8Activations xq;
  if (quantised) QuantizeActivations(x, 1, cols, cols, &xq, pool);
  for (size_t i = 0; i < products.size(); ++i) {
    if (IsQuantised(args[i].w.type)) {
      args[i].xq = &xq;
    } else {
      args[i].x = x;
    }
  }
  const auto rows = [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < products.size(); ++i) {
      const int64_t lo = std::max(begin, first_row[i]);
      const int64_t hi = std::min(end, first_row[i] + args[i].w.rows);
      if (lo < hi) ProductRows(args[i], lo - first_row[i], hi - first_row[i]);
    }
  };
  if (macs < kMinParallelMacs) {
    rows(0, total);
    return;
  }
  pool->ParallelForBalanced(total, rows, kRowGrain, GemvPiece(total, *pool));
}

MatMulPrefetcher::MatMulPrefetcher(const WeightView& w, int64_t n_tokens, const ThreadPool* pool,
                                   int64_t budget_bytes) {
  if (w.rows <= 0 || w.cols <= 0 || n_tokens <= 0 || budget_bytes <= 0) return;
  const int64_t row_read = w.layout == WeightLayout::kInterleaved8
                               ? Interleaved8RowBytes(w.type, w.cols)
                               : *RowBytes(w.type, w.cols);
  const int64_t rows_per_unit = w.layout == WeightLayout::kInterleaved8 ? kGroupRows : 1;
  unit_bytes_ = rows_per_unit * row_read;
  unit_stride_ = rows_per_unit * w.row_bytes;
  // The shares MatMul's split starts from (kRowGrain is whole groups); a GEMV's last
  // pieces may then go to another thread, which only makes the prefetch less exact.
  const int threads = SplitsOverPool(w, n_tokens, pool) ? pool->num_threads() : 1;
  for (int t = 0; t < threads; ++t) {
    int64_t begin = 0, end = w.rows;
    if (threads > 1) ThreadPool::PartitionRange(w.rows, kRowGrain, threads, t, &begin, &end);
    if (begin >= end) continue;
    shares_.push_back({.unit = w.data + begin / rows_per_unit * unit_stride_,
                       .units_left = (end - begin) / rows_per_unit,
                       .offset = 0,
                       .budget = budget_bytes / threads});
  }
}

bool MatMulPrefetcher::Step(int64_t step_bytes) {
  while (step_bytes > 0 && !shares_.empty()) {
    next_ %= shares_.size();
    Share& s = shares_[next_];
    const int64_t n = std::min({step_bytes, s.budget, unit_bytes_ - s.offset});
    const uint8_t* p = s.unit + s.offset;
    for (int64_t b = 0; b < n; b += 64) __builtin_prefetch(p + b, /*rw=*/0, /*locality=*/2);
    s.offset += n;
    s.budget -= n;
    step_bytes -= n;
    if (s.offset == unit_bytes_) {
      s.unit += unit_stride_;
      s.offset = 0;
      --s.units_left;
    }
    if (s.budget <= 0 || s.units_left == 0) {
      shares_.erase(shares_.begin() + static_cast<std::ptrdiff_t>(next_));
    } else {
      ++next_;
    }
  }
  return !shares_.empty();
}

}  // namespace tessera::kernels
