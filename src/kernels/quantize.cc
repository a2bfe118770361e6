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
         type == WeightType::kQ8_0 || type == WeightType::kQ4_0;
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
    default:
      TESSERA_CHECK(false) << "QuantizeRow: " << TraitsOf(type).name << " is dequantise-only";
  }
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
