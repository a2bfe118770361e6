#include "kv/transfer_codec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/half.h"

namespace tessera::kv {
namespace {

constexpr int64_t kQ8Group = 32;
constexpr int64_t kQ8GroupBytes = 34;
constexpr int64_t kMxGroup = 32;
constexpr int64_t kMxGroupBytes = 33;  // the E8M0 scale, then 32 e4m3

int64_t ElemsPerBlock(const KvCacheShape& shape) {
  return shape.BytesPerBlock() / shape.elem_bytes();
}

// One layer of `shape`'s blocks: what one piece of a transfer holds.
KvCacheShape OneLayer(KvCacheShape shape) {
  shape.num_layers = 1;
  return shape;
}

// A block's elements as floats, and back (the row converters: F16C where the CPU
// has it, the scalar functions' bits either way).
void LoadRow(const KvCacheShape& shape, const uint8_t* block, float* out, int64_t n) {
  if (shape.type == kernels::KvType::kF16) {
    F16ToF32Row(reinterpret_cast<const uint16_t*>(block), out, static_cast<size_t>(n));
  } else {
    std::memcpy(out, block, static_cast<size_t>(n) * sizeof(float));
  }
}

void StoreRow(const KvCacheShape& shape, const float* in, uint8_t* block, int64_t n) {
  if (shape.type == kernels::KvType::kF16) {
    F32ToF16Row(in, reinterpret_cast<uint16_t*>(block), static_cast<size_t>(n));
  } else {
    std::memcpy(block, in, static_cast<size_t>(n) * sizeof(float));
  }
}

// One block's elements as floats: the codec's scratch, one per thread.
std::span<float> Scratch(int64_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(n)) scratch.resize(static_cast<size_t>(n));
  return std::span<float>(scratch).first(static_cast<size_t>(n));
}

// Round to nearest, ties to even, for |v| < 2^22 (adding 1.5 * 2^23 leaves no
// fraction bits; the default rounding mode does the rest): std::nearbyint's
// result on the values a q8_0 group quantises (|v| <= 255: x / (max|x| / 127)
// with the scale rounded to f16), in a form the compiler vectorises. Relies on
// strict IEEE arithmetic (no -ffast-math, which this project never uses).
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// fp8 e4m3 tables, built once from the scalar functions: code → f16 bits (every
// e4m3 value is an f16 exactly), and f16 bits → code (F32ToFp8E4M3 of its value).
const std::array<uint16_t, 256>& Fp8ToF16Table() {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = F32ToF16(Fp8E4M3ToF32(static_cast<uint8_t>(v)));
    return t;
  }();
  return table;
}

const std::vector<uint8_t>& F16ToFp8Table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = F32ToFp8E4M3(F16ToF32(static_cast<uint16_t>(h)));
    return t;
  }();
  return table;
}

}  // namespace

std::optional<WireType> ParseWireType(std::string_view name) {
  if (name.empty() || name == "raw") return WireType::kRaw;
  if (name == "f16") return WireType::kF16;
  if (name == "q8_0") return WireType::kQ8_0;
  if (name == "fp8_e4m3") return WireType::kFp8E4M3;
  if (name == "mxfp8") return WireType::kMxFp8;
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
    case WireType::kMxFp8:
      return "mxfp8";
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
    case WireType::kMxFp8:
      return "mxfp8";
  }
  return "f32";
}

namespace {

// The codecs over every element of `shape`'s block (a layer's, as called).
int64_t WireBytesOf(const KvCacheShape& shape, WireType type) {
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
    case WireType::kMxFp8:
      return (elems + kMxGroup - 1) / kMxGroup * kMxGroupBytes;
  }
  return shape.BytesPerBlock();
}

}  // namespace

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

uint8_t MxScaleByte(float amax) {
  if (!(amax > 0) || !std::isfinite(amax)) return 0;
  int exp = 0;
  std::frexp(amax / 448.0f, &exp);  // a first guess, then exact checks (ldexp is exact)
  int s = std::clamp(exp, -127, 127);
  while (s > -127 && std::ldexp(amax, -(s - 1)) <= 448.0f) --s;
  while (s < 127 && std::ldexp(amax, -s) > 448.0f) ++s;
  return static_cast<uint8_t>(s + 127);
}

namespace {

void EncodeElems(const KvCacheShape& shape, WireType type, const uint8_t* block, uint8_t* wire) {
  const int64_t elems = ElemsPerBlock(shape);
  const bool f16_cache = shape.type == kernels::KvType::kF16;
  if (type == WireType::kRaw || (type == WireType::kF16 && f16_cache)) {
    std::memcpy(wire, block, static_cast<size_t>(shape.BytesPerBlock()));
    return;
  }
  if (type == WireType::kFp8E4M3 && f16_cache) {
    const std::vector<uint8_t>& table = F16ToFp8Table();
    const uint16_t* in = reinterpret_cast<const uint16_t*>(block);
    for (int64_t i = 0; i < elems; ++i) wire[i] = table[in[i]];
    return;
  }
  std::span<float> x = Scratch(elems);
  LoadRow(shape, block, x.data(), elems);
  switch (type) {
    case WireType::kRaw:
      return;  // above
    case WireType::kF16:
      F32ToF16Row(x.data(), reinterpret_cast<uint16_t*>(wire), static_cast<size_t>(elems));
      return;
    case WireType::kQ8_0:
      for (int64_t g = 0; g * kQ8Group < elems; ++g) {
        const int64_t n = std::min(kQ8Group, elems - g * kQ8Group);
        const float* in = x.data() + g * kQ8Group;
        float amax = 0;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(in[i]));
        const uint16_t dh = F32ToF16(amax / 127.0f);
        const float dq = F16ToF32(dh);  // quantise against the scale that travels
        uint8_t* out = wire + g * kQ8GroupBytes;
        std::memcpy(out, &dh, 2);
        int8_t q[kQ8Group] = {};
        if (dq > 0) {
          for (int64_t i = 0; i < n; ++i) {
            q[i] = static_cast<int8_t>(std::clamp(RoundHalfEven(in[i] / dq), -127.0f, 127.0f));
          }
        }
        std::memcpy(out + 2, q, kQ8Group);
      }
      return;
    case WireType::kFp8E4M3:
      for (int64_t i = 0; i < elems; ++i) wire[i] = F32ToFp8E4M3(x[static_cast<size_t>(i)]);
      return;
    case WireType::kMxFp8:
      // Scaling by a power of two is exact, and from an f16 cache the scaled value
      // is an f16 again wherever e4m3 can tell it from 0 (|v| >= 2^-14, below 512):
      // the table then gives F32ToFp8E4M3 of it.
      for (int64_t g = 0; g * kMxGroup < elems; ++g) {
        const int64_t n = std::min(kMxGroup, elems - g * kMxGroup);
        float* in = x.data() + g * kMxGroup;
        float amax = 0;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(in[i]));
        uint8_t* out = wire + g * kMxGroupBytes;
        out[0] = MxScaleByte(amax);
        const float unscale = std::ldexp(1.0f, 127 - static_cast<int>(out[0]));
        for (int64_t i = 0; i < n; ++i) in[i] *= unscale;
        if (f16_cache) {
          uint16_t h[kMxGroup];
          F32ToF16Row(in, h, static_cast<size_t>(n));
          const std::vector<uint8_t>& table = F16ToFp8Table();
          for (int64_t i = 0; i < n; ++i) out[1 + i] = table[h[i]];
        } else {
          for (int64_t i = 0; i < n; ++i) out[1 + i] = F32ToFp8E4M3(in[i]);
        }
      }
      return;
  }
}

void DecodeElems(const KvCacheShape& shape, WireType type, const uint8_t* wire, uint8_t* block) {
  const int64_t elems = ElemsPerBlock(shape);
  const bool f16_cache = shape.type == kernels::KvType::kF16;
  if (type == WireType::kRaw || (type == WireType::kF16 && f16_cache)) {
    std::memcpy(block, wire, static_cast<size_t>(shape.BytesPerBlock()));
    return;
  }
  if (type == WireType::kFp8E4M3 && f16_cache) {
    const std::array<uint16_t, 256>& table = Fp8ToF16Table();
    uint16_t* out = reinterpret_cast<uint16_t*>(block);
    for (int64_t i = 0; i < elems; ++i) out[i] = table[wire[i]];
    return;
  }
  std::span<float> x = Scratch(elems);
  switch (type) {
    case WireType::kRaw:
      return;  // above
    case WireType::kF16:
      F16ToF32Row(reinterpret_cast<const uint16_t*>(wire), x.data(), static_cast<size_t>(elems));
      break;
    case WireType::kQ8_0:
      for (int64_t g = 0; g * kQ8Group < elems; ++g) {
        const int64_t n = std::min(kQ8Group, elems - g * kQ8Group);
        const uint8_t* in = wire + g * kQ8GroupBytes;
        uint16_t dh;
        std::memcpy(&dh, in, 2);
        const float d = F16ToF32(dh);
        float* out = x.data() + g * kQ8Group;
        for (int64_t i = 0; i < n; ++i) out[i] = d * static_cast<int8_t>(in[2 + i]);
      }
      break;
    case WireType::kFp8E4M3:
      for (int64_t i = 0; i < elems; ++i) x[static_cast<size_t>(i)] = Fp8E4M3ToF32(wire[i]);
      break;
    case WireType::kMxFp8: {
      static const std::array<float, 256> values = [] {
        std::array<float, 256> t{};
        for (int v = 0; v < 256; ++v) t[v] = Fp8E4M3ToF32(static_cast<uint8_t>(v));
        return t;
      }();
      for (int64_t g = 0; g * kMxGroup < elems; ++g) {
        const int64_t n = std::min(kMxGroup, elems - g * kMxGroup);
        const uint8_t* in = wire + g * kMxGroupBytes;
        const float scale = std::ldexp(1.0f, static_cast<int>(in[0]) - 127);
        float* out = x.data() + g * kMxGroup;
        for (int64_t i = 0; i < n; ++i) out[i] = values[in[1 + i]] * scale;
      }
      break;
    }
  }
  StoreRow(shape, x.data(), block, elems);
}

}  // namespace

int64_t WireBytesPerLayer(const KvCacheShape& shape, WireType type) {
  return WireBytesOf(OneLayer(shape), type);
}

int64_t WireBytesPerBlock(const KvCacheShape& shape, WireType type) {
  return shape.num_layers * WireBytesPerLayer(shape, type);
}

void EncodeLayers(const KvCacheShape& shape, WireType type, int32_t layer_begin, int32_t layer_end,
                  const uint8_t* block, uint8_t* wire) {
  const KvCacheShape one = OneLayer(shape);
  const int64_t from = one.BytesPerBlock(), to = WireBytesOf(one, type);
  for (int32_t l = layer_begin; l < layer_end; ++l) {
    EncodeElems(one, type, block + l * from, wire + l * to);
  }
}

void DecodeLayers(const KvCacheShape& shape, WireType type, int32_t layer_begin, int32_t layer_end,
                  const uint8_t* wire, uint8_t* block) {
  const KvCacheShape one = OneLayer(shape);
  const int64_t from = WireBytesOf(one, type), to = one.BytesPerBlock();
  for (int32_t l = layer_begin; l < layer_end; ++l) {
    DecodeElems(one, type, wire + l * from, block + l * to);
  }
}

void EncodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* block, uint8_t* wire) {
  EncodeLayers(shape, type, 0, shape.num_layers, block, wire);
}

void DecodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* wire, uint8_t* block) {
  DecodeLayers(shape, type, 0, shape.num_layers, wire, block);
}

}  // namespace tessera::kv
