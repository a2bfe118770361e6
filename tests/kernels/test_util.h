// Helpers shared by the kernel tests: seeded random tensors and weight matrices.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"
#include "hwy/targets.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"

namespace tessera::kernels::testing {

inline std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// A random [rows, cols] matrix of `type`: quantised from normal floats, except the
// K-quants: random bytes with sane f16 scales, so that every bit pattern of their
// packed 6-bit scales and quants is exercised (QuantizeRow's are not arbitrary).
struct RandomWeights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

inline RandomWeights MakeRandomWeights(std::mt19937& rng, WeightType type, int64_t rows,
                                       int64_t cols) {
  RandomWeights rw;
  const int64_t row_bytes = *RowBytes(type, cols);
  rw.bytes.resize(rows * row_bytes);
  if (type != WeightType::kQ4_K && type != WeightType::kQ6_K) {
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> src = RandomFloats(rng, cols, 0.5f);
      QuantizeRow(type, src.data(), cols, rw.bytes.data() + r * row_bytes);
    }
  } else {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.02f);
    for (auto& b : rw.bytes) b = static_cast<uint8_t>(byte(rng));
    const int64_t block_bytes = TraitsOf(type).block_bytes;
    for (int64_t off = 0; off < rows * row_bytes; off += block_bytes) {
      const uint16_t d = F32ToF16(scale(rng));
      const uint16_t dmin = F32ToF16(scale(rng));
      if (type == WeightType::kQ4_K) {
        std::memcpy(&rw.bytes[off], &d, 2);
        std::memcpy(&rw.bytes[off + 2], &dmin, 2);
      } else {
        std::memcpy(&rw.bytes[off + kQ6KDOffset], &d, 2);
      }
    }
  }
  rw.view = WeightView{type, rw.bytes.data(), rows, cols, row_bytes};
  return rw;
}

// Runs fn() once per SIMD target the kernels were compiled for and this CPU has
// (AVX-512, AVX2, SSE4, SSSE3, SSE2, …), forcing Highway's dispatch to it.
template <class Fn>
void ForEachTarget(Fn&& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

inline bool BitEqual(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

}  // namespace tessera::kernels::testing
