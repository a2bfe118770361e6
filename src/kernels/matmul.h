// MatMul: y = x · Wᵀ for every WeightType with f32 activations (GEMV when
// n_tokens == 1, register-tiled GEMM otherwise), Highway runtime dispatch.
// Layer: kernels; called by model/ (every linear layer, sharded or whole) and
// engine/ (the TP all-reduce's prefetch of the next matrix). Pure function of its inputs;
// thread-safe; uses the pool it is given.
//
// Batch invariance and the K-chunk tree (the contract tensor parallelism relies on):
// y[t, r] is computed in an order that depends only on W's row r and x[t, :] —
// never on n_tokens, the thread count, tiling or the other tokens. K is split into
// k_chunks equal contiguous chunks (each a whole number of weight blocks); each
// chunk's partial sum c[i] is computed alone, and the partials are combined by
//   Tree(lo, hi) = c[lo] if hi - lo == 1, else Tree(lo, mid) + Tree(mid, hi),
//   mid = lo + (hi - lo) / 2.
// So a rank holding canonical chunks [a, b) that calls MatMul on its column shard
// with k_chunks = b - a gets exactly Tree(a, b), and for power-of-two splits the
// full result is the same tree over the ranks' results (KChunkTreeSum below).
// Quantised weight types quantise x to q8 blocks of 32 (f32 scale per block) and
// use integer dot products; each block's scale depends only on that block of x.
// Float types (F32, F16, BF16) compute each chunk's partial as one FMA chain in k
// order, acc = fma(w[r, k], x[t, k], acc) from acc = 0: the same bits on every
// target. Q8_0 and Q4_0 accumulate, per output and block, acc = fma(float(S),
// d_w·d_x, acc) where S is the block's exact integer dot: the same bits on every
// target. Q4_K accumulates, per output and 32-element sub-block j (d_x, Σx its q8
// block's scale and sum),
//   acc  = fma(float(S_j), (d·sc_j)·d_x, acc)    S_j the exact dot of the nibbles
//   macc = fma(dmin·m_j, d_x·Σx, macc)
// from 0 within a K chunk, whose partial is acc − macc; Q6_K, per sub-block,
//   acc = fma(float(S_j), d·d_x, acc),  S_j = sc_a·Σ(q − 32)·x + sc_b·Σ(q − 32)·x
// over its two halves of 16 (exact): the same bits on every target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/weight_type.h"

namespace tessera {
class ThreadPool;
}

namespace tessera::kernels {

// How a matrix's blocks are laid out in memory.
//  kRows: row-major, each row row_bytes apart, in `type`'s GGUF block layout.
//  kInterleaved8 (rows a multiple of 8, row_bytes = RowBytes): groups of 8 rows,
//    8 · row_bytes apart.
//    F32/F16/BF16: within a group, column k's 8 elements (row order) at [8k, 8k + 8)
//    elements: one vector load holds column k of 8 rows (lanes = rows), and each
//    lane keeps its own FMA chain. kRows float matrices are packed so on the fly, a
//    slab of rows at a time (PackFloatGroups), so both layouts give the same bits.
//    Q8_0/Q4_0: within a group, block j (8 block widths at
//    8 · j · block bytes) holds the 8 rows' f16 scales (16 bytes, row order), then
//    chunks of 32 bytes, chunk c = bytes [4c, 4c + 4) of each row's quant bytes (32
//    for Q8_0, 16 for Q4_0), row after row. One 32-byte load then holds 4 quant bytes
//    of each of 8 rows (lanes = rows): the kernel sums vertically, with no horizontal
//    sums and one vector load of the 8 scales (Interleave8). The same integer block
//    dots, so the same bits as kRows.
//    Q4_K: within a group, super-block b (kQ4KGroupSuperBytes = 1184 bytes at
//    1184 · b) holds the 8 rows' f16 d (16 bytes), f16 dmin (16), the 6-bit
//    sub-block scales unpacked to bytes, sc_s of row r at 32 + 8s + r, the mins
//    likewise at 96 + 8s + r, then the quants: pair p (sub-blocks 2p and 2p + 1),
//    chunk c (0..7), 32 bytes at 160 + 256p + 32c = bytes [32p + 4c, 32p + 4c + 4)
//    of each row's 128 quant bytes, whose low nibbles are elements 64p + 4c.. of
//    sub-block 2p and high nibbles 64p + 32 + 4c.. of sub-block 2p + 1. A row takes
//    148 bytes per super-block instead of 144 (Interleaved8RowBytes): the unpacked
//    scales are 8-lane loads. The same integer sub-block dots, the same bits as kRows.
//    Q6_K: within a group, super-block b (1680 bytes at 1680 · b) holds the 8 rows'
//    f16 d (16 bytes), their int8 scales (scale g of row r at 16 + 8g + r), then per
//    half n of the super-block and chunk c (0..7) 96 bytes at 144 + 768n + 96c:
//    bytes [4c, 4c + 4) of each row's first 32 ql bytes of the half, of its second
//    32, and of its 32 qh bytes. One chunk gives 4 elements of each of the half's 4
//    sub-blocks (nibble and 2 qh bits: 6-bit quants, lane = row).
enum class WeightLayout : uint8_t { kRows, kInterleaved8 };

// A weight matrix [rows = out features, cols = in features (K)] in `layout`.
// Borrowed, not owned.
struct WeightView {
  WeightType type = WeightType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;  // >= RowBytes(type, cols)
  WeightLayout layout = WeightLayout::kRows;
};

// Whether `w` can be interleaved: F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K in kRows with
// rows a multiple of 8 (any row stride: a column shard's rows are its matrix's apart).
bool CanInterleave8(const WeightView& w);
// Bytes per row of an interleaved matrix of `cols` columns (its row_bytes):
// RowBytes(type, cols), except Q4_K's 148 per 256 columns.
int64_t Interleaved8RowBytes(WeightType type, int64_t cols);
// Writes w (CanInterleave8) into `out` (rows · Interleaved8RowBytes(type, cols)
// bytes) in the kInterleaved8 layout; the returned view reads it.
WeightView Interleave8(const WeightView& w, uint8_t* out);
// Writes row r of w, in either layout, to `out` in its type's GGUF block layout
// (RowBytes(type, cols) bytes, what DequantizeRow reads): the embedding lookup of a
// head interleaved for the matmul.
void GgufRow(const WeightView& w, int64_t r, uint8_t* out);

struct MatMulOptions {
  int k_chunks = 0;      // 0 = CanonicalKChunks(type, cols)
  int64_t x_stride = 0;  // floats between tokens of x; 0 = cols
  int64_t y_stride = 0;  // floats between tokens of y; 0 = rows
};

// Granularity of a K chunk: elements per weight block, and at least the 32 of a q8
// activation block for quantised types (1 for f32/f16/bf16).
int64_t KChunkGranularity(WeightType type);

// The largest of {8, 4, 2, 1} such that cols is divisible by chunks × granularity.
int CanonicalKChunks(WeightType type, int64_t cols);

// The canonical tree over partials[lo, hi) (see above).
float KChunkTreeSum(const float* partials, int lo, int hi);

// Columns [col_begin, col_end) of w (a row-parallel shard: same rows and row_bytes,
// fewer columns). Both bounds must be multiples of KChunkGranularity(type).
WeightView ColumnShard(const WeightView& w, int64_t col_begin, int64_t col_end);

// Rows [row_begin, row_end) of w (a column-parallel shard).
WeightView RowShard(const WeightView& w, int64_t row_begin, int64_t row_end);

// y[t, r] = Σ_k W[r, k] · x[t, k] for t < n_tokens, r < rows.
// x: [n_tokens, cols] (stride options.x_stride); y: [n_tokens, rows] (stride
// options.y_stride). pool may be null (runs on the calling thread).
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y,
            const MatMulOptions& options = {}, ThreadPool* pool = nullptr);

// One product of MatMulShared: y = x · Wᵀ with w's K chunks (0 = canonical); at
// most kMaxSharedProducts of them share an input.
inline constexpr size_t kMaxSharedProducts = 8;
struct SharedProduct {
  WeightView w;
  float* y = nullptr;  // [n_tokens, w.rows]
  int k_chunks = 0;
};

// Several products of one input x ([n_tokens, cols], every w with those cols): a
// layer's Q, K and V, or an FFN's gate and up. Each y gets MatMul's bits. A GEMV
// (n_tokens == 1) quantises x once and runs every product's rows as one job
// balanced over the pool, so decode wakes the pool and waits for its slowest thread
// once instead of once a product; batches run MatMul on each product in turn.
void MatMulShared(std::span<const SharedProduct> products, const float* x, int64_t n_tokens,
                  ThreadPool* pool);

// Pulls into the cache, a step at a time, the bytes that MatMul(w, ·, n_tokens, ·,
// ·, pool) will read first: the start of each thread's share of the rows, the
// budget split evenly among the shares. For a core that would otherwise wait (the
// engine runs it inside a tensor-parallel all-reduce, through comm's
// Communicator::SetWaitWork, on the matrix the layer multiplies by next). Only
// prefetches: results never depend on it. The matrix's bytes must outlive it.
class MatMulPrefetcher {
 public:
  static constexpr int64_t kStepBytes = 16 << 10;

  MatMulPrefetcher(const WeightView& w, int64_t n_tokens, const ThreadPool* pool,
                   int64_t budget_bytes);
  // Prefetches up to step_bytes more; false once the budget is spent.
  bool Step(int64_t step_bytes = kStepBytes);

 private:
  struct Share {
    const uint8_t* unit = nullptr;  // the unit (row, or interleaved group) being read
    int64_t units_left = 0;
    int64_t offset = 0;  // bytes of `unit` already prefetched
    int64_t budget = 0;
  };
  std::vector<Share> shares_;
  int64_t unit_bytes_ = 0;   // bytes MatMul reads of a unit
  int64_t unit_stride_ = 0;  // bytes from one unit to the next
  size_t next_ = 0;
};

// q8 activations for the quantised dot products, one row per token, blocks of 32:
// d = amax / 127, q = nearbyint(x / d) (0 when amax == 0), sum_q = Σq, sum_d = d · Σq.
struct Q8Activations {
  int64_t n_tokens = 0;
  int64_t cols = 0;
  std::vector<int8_t> qs;      // [n_tokens, cols]
  std::vector<float> d;        // [n_tokens, cols / 32]
  std::vector<int32_t> sum_q;  // [n_tokens, cols / 32]
  std::vector<float> sum_d;    // [n_tokens, cols / 32]
};
void QuantizeActivationsQ8(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride,
                           Q8Activations* out);

}  // namespace tessera::kernels
