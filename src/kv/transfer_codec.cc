#include "kv/transfer_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/half.h"

namespace tessera::kv {
namespace {

constexpr int64_t kQ8Group = 32;
constexpr int64_t kQ8GroupBytes = 34;

int64_t ElemsPerBlock(const KvCacheShape& shape) {
  return shape.BytesPerBlock() / shape.elem_bytes();
}

float LoadElem(const KvCacheShape& shape, const uint8_t* block, int64_t i) {
  if (shape.type == kernels::KvType::kF16) {
    uint16_t h;
    std::memcpy(&h, block + i * 2, 2);
    return F16ToF32(h);
  }
  float f;
  std::memcpy(&f, block + i * 4, 4);
  return f;
}

void StoreElem(const KvCacheShape& shape, uint8_t* block, int64_t i, float x) {
  if (shape.type == kernels::KvType::kF16) {
    const uint16_t h = F32ToF16(x);
    std::memcpy(block + i * 2, &h, 2);
  } else {
    std::memcpy(block + i * 4, &x, 4);
  }
}

}  // namespace

std::optional<WireType> ParseWireType(std::string_view name) {
  if (name.empty() || name == "raw") return WireType::kRaw;
  if (name == "f16") return WireType::kF16;
  if (name == "q8_0") return WireType::kQ8_0;
  if (name == "fp8_e4m3") return WireType::kFp8E4M3;
  return std::nullopt;
}

std::string_view WireTypeName(WireType type) {
  switch (type) {
    case WireType::kRaw:
      return "raw";
    case WireType::kF16:
      return "f16";
    case WireType::kQ8_0:
      return "q8_0";
    case WireType::kFp8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

std::string_view WirePlanDType(WireType type, const KvCacheShape& shape) {
  switch (type) {
    case WireType::kRaw:
      return shape.type == kernels::KvType::kF16 ? "f16" : "f32";
    case WireType::kF16:
      return "f16";
    case WireType::kQ8_0:
      return "q8_0";
    case WireType::kFp8E4M3:
      return "fp8";
  }
  return "f32";
}

int64_t WireBytesPerBlock(const KvCacheShape& shape, WireType type) {
  const int64_t elems = ElemsPerBlock(shape);
  switch (type) {
    case WireType::kRaw:
      return shape.BytesPerBlock();
    case WireType::kF16:
      return elems * 2;
    case WireType::kQ8_0:
      return (elems + kQ8Group - 1) / kQ8Group * kQ8GroupBytes;
    case WireType::kFp8E4M3:
      return elems;
  }
  return shape.BytesPerBlock();
}

uint8_t F32ToFp8E4M3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::fabs(x);
  if (std::isnan(a)) return sign | 0x7f;
  if (a >= 448.0f) return sign | 0x7e;  // saturate at the largest finite value
  // Smallest normal 2^-6; subnormals step 2^-9.
  int exp = 0;
  if (a < std::ldexp(1.0f, -6)) {
    const int m = static_cast<int>(std::nearbyint(a / std::ldexp(1.0f, -9)));  // 0..8
    if (m >= 8) return sign | 0x08;  // rounds up to the smallest normal
    return sign | static_cast<uint8_t>(m);
  }
  const float frac = std::frexp(a, &exp);  // a = frac * 2^exp, frac in [0.5, 1)
  int e = exp - 1;                         // a = (2 * frac) * 2^e, 2 * frac in [1, 2)
  int m = static_cast<int>(std::nearbyint((2 * frac - 1) * 8));  // 3 mantissa bits
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && m == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(biased << 3) | static_cast<uint8_t>(m);
}

float Fp8E4M3ToF32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int e = (v >> 3) & 0xf;
  const int m = v & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8, e - 7);
}

void EncodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* block, uint8_t* wire) {
  const int64_t elems = ElemsPerBlock(shape);
  switch (type) {
    case WireType::kRaw:
      std::memcpy(wire, block, static_cast<size_t>(shape.BytesPerBlock()));
      return;
    case WireType::kF16:
      for (int64_t i = 0; i < elems; ++i) {
        const uint16_t h = F32ToF16(LoadElem(shape, block, i));
        std::memcpy(wire + i * 2, &h, 2);
      }
      return;
    case WireType::kQ8_0:
      for (int64_t g = 0; g * kQ8Group < elems; ++g) {
        const int64_t n = std::min(kQ8Group, elems - g * kQ8Group);
        float x[kQ8Group] = {};
        float amax = 0;
        for (int64_t i = 0; i < n; ++i) {
          x[i] = LoadElem(shape, block, g * kQ8Group + i);
          amax = std::max(amax, std::fabs(x[i]));
        }
        const float d = amax / 127.0f;
        const uint16_t dh = F32ToF16(d);
        const float dq = F16ToF32(dh);  // quantise against the scale that travels
        uint8_t* out = wire + g * kQ8GroupBytes;
        std::memcpy(out, &dh, 2);
        for (int64_t i = 0; i < kQ8Group; ++i) {
          const float q = dq > 0 ? std::nearbyint(x[i] / dq) : 0.0f;
          out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
        }
      }
      return;
    case WireType::kFp8E4M3:
      for (int64_t i = 0; i < elems; ++i) wire[i] = F32ToFp8E4M3(LoadElem(shape, block, i));
      return;
  }
}

void DecodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* wire, uint8_t* block) {
  const int64_t elems = ElemsPerBlock(shape);
  switch (type) {
    case WireType::kRaw:
      std::memcpy(block, wire, static_cast<size_t>(shape.BytesPerBlock()));
      return;
    case WireType::kF16:
      for (int64_t i = 0; i < elems; ++i) {
        uint16_t h;
        std::memcpy(&h, wire + i * 2, 2);
        StoreElem(shape, block, i, F16ToF32(h));
      }
      return;
    case WireType::kQ8_0:
      for (int64_t g = 0; g * kQ8Group < elems; ++g) {
        const int64_t n = std::min(kQ8Group, elems - g * kQ8Group);
        const uint8_t* in = wire + g * kQ8GroupBytes;
        uint16_t dh;
        std::memcpy(&dh, in, 2);
        const float d = F16ToF32(dh);
        for (int64_t i = 0; i < n; ++i) {
          StoreElem(shape, block, g * kQ8Group + i, d * static_cast<int8_t>(in[2 + i]));
        }
      }
      return;
    case WireType::kFp8E4M3:
      for (int64_t i = 0; i < elems; ++i) StoreElem(shape, block, i, Fp8E4M3ToF32(wire[i]));
      return;
  }
}

}  // namespace tessera::kv
