#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/half.h"

namespace tessera::kernels {
namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// ggml's quantize_row_q8_0_ref: d = amax/127, q = round(x/d) (half away from zero).
void QuantizeQ8_0(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(dst, F32ToF16(d));
    for (int j = 0; j < 32; ++j) {
      dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(src[j] * id)));
    }
  }
}

// ggml's quantize_row_q4_0_ref: d = (value of largest magnitude) / -8, so that value
// maps to q = 0 and the range [-8, 7] is used asymmetrically; q = min(15, trunc(x/d + 8.5)).
void QuantizeQ4_0(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 18) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(src[j])) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(dst, F32ToF16(d));
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(src[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(src[j + 16] * id + 8.5f)));
      dst[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Q4_K by rounding to nearest (not ggml's search for the scales that minimise the
// error, so the bytes differ from llama.cpp's quantiser; the layout is the same).
// Sub-block s of 32: x ≈ scale_s·q − offset_s, q in 0..15, offset_s = max(0, −min x),
// scale_s = (max x + offset_s) / 15; the super-block's d and dmin make the largest
// scale and offset 63, each sub-block's 6-bit sc and m round scale/d and offset/dmin,
// and q rounds x against the stored (f16) d·sc and dmin·m.
void QuantizeQ4_K(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / 256; ++b, src += 256, dst += 144) {
    float scale[8], offset[8];
    float max_scale = 0.0f, max_offset = 0.0f;
    for (int s = 0; s < 8; ++s) {
      float lo = src[32 * s], hi = src[32 * s];
      for (int j = 1; j < 32; ++j) {
        lo = std::min(lo, src[32 * s + j]);
        hi = std::max(hi, src[32 * s + j]);
      }
      offset[s] = std::max(0.0f, -lo);
      scale[s] = std::max(0.0f, hi + offset[s]) / 15.0f;
      max_scale = std::max(max_scale, scale[s]);
      max_offset = std::max(max_offset, offset[s]);
    }
    const uint16_t d16 = F32ToF16(max_scale / 63.0f), dmin16 = F32ToF16(max_offset / 63.0f);
    const float d = F16ToF32(d16), dmin = F16ToF32(dmin16);
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; ++s) {
      sc[s] = static_cast<uint8_t>(d > 0 ? std::clamp(std::lround(scale[s] / d), 0L, 63L) : 0);
      m[s] =
          static_cast<uint8_t>(dmin > 0 ? std::clamp(std::lround(offset[s] / dmin), 0L, 63L) : 0);
    }
    StoreU16(dst, d16);
    StoreU16(dst + 2, dmin16);
    // The 12 scale bytes, as Q4KScaleMin reads them: sub-blocks 0..3 in the low 6 bits
    // of bytes 0..3 (scales) and 4..7 (mins); 4..7 split into a low nibble in bytes
    // 8..11 and 2 high bits in the top of bytes 0..3 (scales) and 4..7 (mins).
    uint8_t* scales = dst + kQ4KScalesOffset;
    for (int j = 0; j < 4; ++j) {
      scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
      scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
    uint8_t q[256];
    for (int s = 0; s < 8; ++s) {
      const float step = d * static_cast<float>(sc[s]);
      const float base = dmin * static_cast<float>(m[s]);
      for (int j = 0; j < 32; ++j) {
        const float v = step > 0 ? (src[32 * s + j] + base) / step : 0.0f;
        q[32 * s + j] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 15L));
      }
    }
    // Each 64 elements share 32 bytes: the first 32 in the low nibbles, the next 32
    // in the high ones.
    uint8_t* qs = dst + kQ4KQsOffset;
    for (int pair = 0; pair < 4; ++pair) {
      for (int l = 0; l < 32; ++l) {
        qs[32 * pair + l] = static_cast<uint8_t>(q[64 * pair + l] | (q[64 * pair + 32 + l] << 4));
      }
    }
  }
}

// Q6_K by rounding to nearest (not ggml's search; the layout is ggml's). Sub-block g
// of 16: x ≈ d·sc_g·q, q in −32..31, sc_g = round(amax_g / 31 / d) in 0..127 with d
// making the largest sub-block scale 127.
void QuantizeQ6_K(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / 256; ++b, src += 256, dst += 210) {
    float scale[16];
    float max_scale = 0.0f;
    for (int g = 0; g < 16; ++g) {
      float amax = 0.0f;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(src[16 * g + j]));
      scale[g] = amax / 31.0f;
      max_scale = std::max(max_scale, scale[g]);
    }
    const uint16_t d16 = F32ToF16(max_scale / 127.0f);
    const float d = F16ToF32(d16);
    auto* scales = reinterpret_cast<int8_t*>(dst + kQ6KScalesOffset);
    uint8_t q[256];  // biased: 0..63
    for (int g = 0; g < 16; ++g) {
      scales[g] = static_cast<int8_t>(d > 0 ? std::clamp(std::lround(scale[g] / d), 0L, 127L) : 0);
      const float step = d * static_cast<float>(scales[g]);
      for (int j = 0; j < 16; ++j) {
        const float v = step > 0 ? src[16 * g + j] / step : 0.0f;
        q[16 * g + j] = static_cast<uint8_t>(std::clamp(std::lround(v), -32L, 31L) + 32);
      }
    }
    StoreU16(dst + kQ6KDOffset, d16);
    // Per half of 128: ql[l] holds elements l (low nibble) and 64 + l (high), ql[32 + l]
    // elements 32 + l and 96 + l; qh[l] the high 2 bits of l, 32 + l, 64 + l, 96 + l.
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = dst + 64 * half;
      uint8_t* qh = dst + kQ6KQhOffset + 32 * half;
      const uint8_t* h = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((h[l] & 0xF) | ((h[64 + l] & 0xF) << 4));
        ql[32 + l] = static_cast<uint8_t>((h[32 + l] & 0xF) | ((h[96 + l] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((h[l] >> 4) | ((h[32 + l] >> 4) << 2) |
                                     ((h[64 + l] >> 4) << 4) | ((h[96 + l] >> 4) << 6));
      }
    }
  }
}

void DequantizeQ8_0(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const float d = F16ToF32(LoadU16(src));
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(static_cast<int8_t>(src[2 + j]));
  }
}

void DequantizeQ4_0(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
    const float d = F16ToF32(LoadU16(src));
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((src[2 + j] & 0xF) - 8);
      dst[j + 16] = d * static_cast<float>((src[2 + j] >> 4) - 8);
    }
  }
}

void DequantizeQ4_K(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 256; ++b, src += 144) {
    const float d = F16ToF32(LoadU16(src));
    const float dmin = F16ToF32(LoadU16(src + 2));
    const uint8_t* scales = src + kQ4KScalesOffset;
    const uint8_t* qs = src + kQ4KQsOffset;
    for (int pair = 0; pair < 4; ++pair, qs += 32) {
      uint8_t sc0, m0, sc1, m1;
      Q4KScaleMin(2 * pair, scales, &sc0, &m0);
      Q4KScaleMin(2 * pair + 1, scales, &sc1, &m1);
      const float d0 = d * sc0, min0 = dmin * m0;
      const float d1 = d * sc1, min1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *dst++ = d0 * static_cast<float>(qs[l] & 0xF) - min0;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(qs[l] >> 4) - min1;
    }
  }
}

void DequantizeQ6_K(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 256; ++b, src += 210) {
    const float d = F16ToF32(LoadU16(src + kQ6KDOffset));
    const uint8_t* ql = src;
    const uint8_t* qh = src + kQ6KQhOffset;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + kQ6KScalesOffset);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void CheckWholeBlocks(WeightType type, int64_t n) {
  const int64_t block = TraitsOf(type).block_elems;
  TESSERA_CHECK(n >= 0 && n % block == 0)
      << n << " elements is not a whole number of " << TraitsOf(type).name << " blocks";
}

}  // namespace

bool CanQuantize(WeightType type) {
  return type == WeightType::kF32 || type == WeightType::kF16 || type == WeightType::kBF16 ||
         type == WeightType::kQ8_0 || type == WeightType::kQ4_0 || type == WeightType::kQ4_K ||
         type == WeightType::kQ6_K;
}

void QuantizeRow(WeightType type, const float* src, int64_t n, uint8_t* dst) {
  CheckWholeBlocks(type, n);
  switch (type) {
    case WeightType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, F32ToF16(src[i]));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(dst + 2 * i, F32ToBf16(src[i]));
      return;
    case WeightType::kQ8_0:
      QuantizeQ8_0(src, n, dst);
      return;
    case WeightType::kQ4_0:
      QuantizeQ4_0(src, n, dst);
      return;
    case WeightType::kQ4_K:
      QuantizeQ4_K(src, n, dst);
      return;
    case WeightType::kQ6_K:
      QuantizeQ6_K(src, n, dst);
      return;
  }
  TESSERA_CHECK(false) << "QuantizeRow: unknown type " << static_cast<uint32_t>(type);
}

void DequantizeRow(WeightType type, const uint8_t* src, int64_t n, float* dst) {
  CheckWholeBlocks(type, n);
  switch (type) {
    case WeightType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(LoadU16(src + 2 * i));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(LoadU16(src + 2 * i));
      return;
    case WeightType::kQ8_0:
      DequantizeQ8_0(src, n, dst);
      return;
    case WeightType::kQ4_0:
      DequantizeQ4_0(src, n, dst);
      return;
    case WeightType::kQ4_K:
      DequantizeQ4_K(src, n, dst);
      return;
    case WeightType::kQ6_K:
      DequantizeQ6_K(src, n, dst);
      return;
  }
  TESSERA_CHECK(false) << "DequantizeRow: unknown type " << static_cast<uint32_t>(type);
}

}  // namespace tessera::kernels
