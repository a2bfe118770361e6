// Row quantisers and dequantisers for the weight formats in weight_type.h, in ggml's
// block layouts (so GGUF files written by `tessera synth` read the same in
// llama.cpp); F32 to Q4_0 bit-exact with ggml's reference quantisers, the K-quants
// rounded to nearest without ggml's search for the best scales. Layer: kernels; called by model/
// (GGUF loading, synth) and by the tests as the dequantise-then-f32 oracle.
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "kernels/weight_type.h"

namespace tessera::kernels {

// Block layouts (little-endian, packed, as ggml stores them):
//   F32   4 bytes/elem.   F16 2 bytes/elem (IEEE half).   BF16 2 bytes/elem.
//   Q8_0  34 bytes per 32: f16 d; int8 q[32];               x = d*q
//   Q4_0  18 bytes per 32: f16 d; u8 qs[16];                x[j] = d*((qs[j]&15)-8),
//                                                           x[j+16] = d*((qs[j]>>4)-8)
//   Q4_K 144 bytes per 256: f16 d; f16 dmin; u8 scales[12] (8 six-bit scales and
//        8 six-bit mins); u8 qs[128]. Sub-block s (32 elems) = d*sc[s]*q - dmin*m[s];
//        each 64 elements share 32 bytes of qs: low nibbles first, then high nibbles.
//   Q6_K 210 bytes per 256: u8 ql[128] (low 4 bits); u8 qh[64] (high 2 bits);
//        int8 scales[16] (one per 16 elems); f16 d. x = d*scale*(q-32).

// Writes RowBytes(type, n) bytes. n must be a whole number of blocks. Every
// WeightType is supported.
void QuantizeRow(WeightType type, const float* src, int64_t n, uint8_t* dst);

// Reads RowBytes(type, n) bytes, writes n floats. Every WeightType is supported.
void DequantizeRow(WeightType type, const uint8_t* src, int64_t n, float* dst);

// True if QuantizeRow supports `type`.
bool CanQuantize(WeightType type);

// Byte offsets inside the K-quant super-blocks (for tests and SIMD kernels).
inline constexpr int64_t kQ4KScalesOffset = 4;
inline constexpr int64_t kQ4KQsOffset = 16;
inline constexpr int64_t kQ6KQhOffset = 128;
inline constexpr int64_t kQ6KScalesOffset = 192;
inline constexpr int64_t kQ6KDOffset = 208;

// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes.
inline void Q4KScaleMin(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

}  // namespace tessera::kernels
