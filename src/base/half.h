// IEEE binary16 (f16) and bfloat16 conversions: scalar ones inline, and f16 rows
// converted 8 at a time with F16C where the CPU has it (the f16 KV cache's store,
// comm/'s f16 reductions). Layer: base.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera {

inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int shift = 0;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ff;
      bits = sign | (static_cast<uint32_t>(127 - 15 - shift + 1) << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest even; overflow to infinity; NaN stays NaN.
inline uint16_t F32ToF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  // Subnormal or zero in f16.
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    // value = mantissa * 2^(exponent - 150); the f16 subnormal unit is 2^-24.
    uint32_t drop = 126 - exponent;  // in [14, 24] here
    uint32_t q = mantissa >> drop;
    uint32_t rem = mantissa & ((1u << drop) - 1);
    uint32_t halfway = 1u << (drop - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// n values each way, the scalar functions' bits (F16ToF32 and F32ToF16; under F16C
// a NaN keeps its payload, and a signalling one comes back quiet).
void F16ToF32Row(const uint16_t* in, float* out, size_t n);
void F32ToF16Row(const float* in, uint16_t* out, size_t n);

inline float Bf16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t F32ToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  uint32_t rounded = x + 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace tessera
