// Internal to kernels/: the arguments MatMul hands to its per-target (Highway)
// row kernels, and the inline K-chunk tree. Not for callers outside kernels/.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace tessera::kernels {

inline constexpr int kMaxKChunks = 64;

struct MatMulArgs {
  WeightView w;
  const float* x = nullptr;           // [n_tokens, x_stride] (float weight types)
  const Q8Activations* xq = nullptr;  // quantised x (quantised weight types)
  int64_t x_stride = 0;
  int64_t n_tokens = 0;
  float* y = nullptr;  // [n_tokens, y_stride]
  int64_t y_stride = 0;
  int k_chunks = 1;
  int64_t chunk_elems = 0;  // cols / k_chunks
};

// Computes y[:, row_begin:row_end) (runtime-dispatched to the best SIMD target), one
// entry per weight family: Q8_0 and Q4_0 (matmul_block_scaled_x86.cc), Q4_K and Q6_K
// (matmul_kquant_x86.cc), F32, F16 and BF16 (matmul_float_hwy.cc).
void MatMulBlockScaledRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulKQuantRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulFloatRows(const MatMulArgs& args, int64_t row_begin, int64_t row_end);

// Float weights are read in groups of this many rows (kInterleaved8).
inline constexpr int64_t kGroupRows = 8;

// A Q4_K super-block of a group of 8 interleaved rows (matmul.h): byte offsets.
inline constexpr int64_t kQ4KGroupD = 0;        // 8 f16 d
inline constexpr int64_t kQ4KGroupDMin = 16;    // 8 f16 dmin
inline constexpr int64_t kQ4KGroupScales = 32;  // sc_s of row r at 8s + r
inline constexpr int64_t kQ4KGroupMins = 96;    // m_s of row r at 8s + r
inline constexpr int64_t kQ4KGroupQuants = 160;
inline constexpr int64_t kQ4KGroupSuperBytes = 1184;

// A Q6_K super-block of a group of 8 interleaved rows (matmul.h): byte offsets.
inline constexpr int64_t kQ6KGroupD = 0;         // 8 f16 d
inline constexpr int64_t kQ6KGroupScales = 16;   // int8 scale g of row r at 8g + r
inline constexpr int64_t kQ6KGroupQuants = 144;  // (half n, chunk c) at 768n + 96c
inline constexpr int64_t kQ6KGroupSuperBytes = 1680;

// Rows [row_begin, row_end) of a float kRows matrix into `out` in the kInterleaved8
// layout: group after group (8 · cols elements each), within a group column k's 8
// elements at [8k, 8k + 8); rows past row_end in the last group are zeros.
void PackFloatGroups(const WeightView& w, int64_t row_begin, int64_t row_end, uint8_t* out);

// Fills out's tokens [t_begin, t_end) (out already sized for all tokens;
// matmul_q8_activations_x86.cc).
void QuantizeQ8Rows(const float* x, int64_t x_stride, int64_t t_begin, int64_t t_end,
                    Q8Activations* out);

inline float TreeSumRecursive(const float* c, int lo, int hi) {
  if (hi - lo == 1) return c[lo];
  const int mid = lo + (hi - lo) / 2;
  return TreeSumRecursive(c, lo, mid) + TreeSumRecursive(c, mid, hi);
}

// Same tree; the common power-of-two counts unrolled (pairwise levels).
inline float TreeSum(const float* c, int lo, int hi) {
  switch (hi - lo) {
    case 1:
      return c[lo];
    case 2:
      return c[lo] + c[lo + 1];
    case 4:
      return (c[lo] + c[lo + 1]) + (c[lo + 2] + c[lo + 3]);
    case 8:
      return ((c[lo] + c[lo + 1]) + (c[lo + 2] + c[lo + 3])) +
             ((c[lo + 4] + c[lo + 5]) + (c[lo + 6] + c[lo + 7]));
    default:
      return TreeSumRecursive(c, lo, hi);
  }
}

}  // namespace tessera::kernels
