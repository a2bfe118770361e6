#include "base/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

namespace tessera {
namespace {

// The compiler's _Float16 (IEEE binary16, round-to-nearest-even) is the oracle.
TEST(HalfTest, F16ToF32MatchesCompilerForEveryBitPattern) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    _Float16 reference;
    uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&reference, &bits, 2);
    float expected = static_cast<float>(reference);
    float actual = F16ToF32(bits);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << h;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(expected), std::bit_cast<uint32_t>(actual)) << h;
    }
  }
}

TEST(HalfTest, F32ToF16MatchesCompilerOnRandomAndEdgeValues) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits_dist;
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               1e-8f,
                               5.96e-8f,
                               2.98e-8f,
                               2.99e-8f,
                               6.1e-5f,
                               6.09e-5f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 200000; ++i) values.push_back(std::bit_cast<float>(bits_dist(rng)));
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int i = 0; i < 200000; ++i) values.push_back(small(rng));
  for (float v : values) {
    _Float16 reference = static_cast<_Float16>(v);
    uint16_t expected;
    std::memcpy(&expected, &reference, 2);
    uint16_t actual = F32ToF16(v);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(F16ToF32(actual)));
    } else {
      EXPECT_EQ(expected, actual) << v;
    }
  }
}

// The row conversions (F16C 8 at a time where the CPU has it, a scalar tail) give
// the scalar functions' bits: every f16 pattern one way, random bit patterns and
// ties the other, in rows whose length is no multiple of 8; NaNs stay NaN.
TEST(HalfTest, RowConversionsGiveTheScalarBits) {
  std::vector<uint16_t> halves(0x10000 + 3);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(halves.size());
  F16ToF32Row(halves.data(), floats.data(), halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    const float expected = F16ToF32(halves[i]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(floats[i])) << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(floats[i]), std::bit_cast<uint32_t>(expected)) << i;
    }
  }

  std::mt19937 rng(9);
  std::uniform_int_distribution<uint32_t> bits_dist;
  std::vector<float> values(200003);
  for (float& v : values) v = std::bit_cast<float>(bits_dist(rng));
  const float ties[] = {
      1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65519.0f, 65520.0f, 6.0e-8f, 2.98e-8f};
  std::copy(std::begin(ties), std::end(ties), values.begin() + 1001);
  std::vector<uint16_t> out(values.size());
  F32ToF16Row(values.data(), out.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      ASSERT_TRUE(std::isnan(F16ToF32(out[i]))) << i;
    } else {
      ASSERT_EQ(out[i], F32ToF16(values[i])) << i << ": " << values[i];
    }
  }
}

TEST(HalfTest, Bf16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway and rounds up to the even neighbour.
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    float f = Bf16ToF32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(F32ToBf16(f), b);
    }
  }
}

}  // namespace
}  // namespace tessera
