#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"

namespace tessera::kernels {
namespace {

std::vector<float> Ramp32() {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  return x;
}

TEST(QuantizeTest, Q8_0KnownVector) {
  std::vector<float> x = Ramp32();
  std::vector<uint8_t> q(34);
  QuantizeRow(WeightType::kQ8_0, x.data(), 32, q.data());
  // d = 16/127 = 0.12598… -> f16 0x3008; q = round((j-16) * 127/16).
  EXPECT_EQ(q[0], 0x08);
  EXPECT_EQ(q[1], 0x30);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 0]), -127);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 16]), 0);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 17]), 8);    // 7.9375 -> 8
  EXPECT_EQ(static_cast<int8_t>(q[2 + 31]), 119);  // 119.06 -> 119
  EXPECT_EQ(static_cast<int8_t>(q[2 + 14]), -16);  // -15.875 -> -16
}

TEST(QuantizeTest, Q4_0KnownVector) {
  std::vector<float> x = Ramp32();
  std::vector<uint8_t> q(18);
  QuantizeRow(WeightType::kQ4_0, x.data(), 32, q.data());
  // Largest magnitude is -16 -> d = -16/-8 = 2 (f16 0x4000); q = min(15, trunc(x/2 + 8.5)).
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[1], 0x40);
  EXPECT_EQ(q[2 + 0], 0x80);   // j=0 -> 0, j=16 -> 8
  EXPECT_EQ(q[2 + 1], 0x91);   // j=1 -> 1, j=17 -> 9
  EXPECT_EQ(q[2 + 15], 0xF8);  // j=15 -> 8, j=31 -> min(15, 16)
  std::vector<float> back(32);
  DequantizeRow(WeightType::kQ4_0, q.data(), 32, back.data());
  EXPECT_EQ(back[0], -16.0f);
  EXPECT_EQ(back[31], 14.0f);
}

TEST(QuantizeTest, ZeroBlockHasZeroScale) {
  std::vector<float> x(64, 0.0f);
  for (WeightType type : {WeightType::kQ8_0, WeightType::kQ4_0}) {
    std::vector<uint8_t> q(*RowBytes(type, 64));
    QuantizeRow(type, x.data(), 64, q.data());
    std::vector<float> back(64, 1.0f);
    DequantizeRow(type, q.data(), 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
  }
}

TEST(QuantizeTest, RoundTripErrorBounded) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 32 * 9;
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0,
                          WeightType::kQ4_0}) {
    std::vector<uint8_t> q(*RowBytes(type, n));
    QuantizeRow(type, x.data(), n, q.data());
    std::vector<float> back(n);
    DequantizeRow(type, q.data(), n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      for (int j = 0; j < 32; ++j) {
        const float v = x[b * 32 + j];
        float bound = 0;
        switch (type) {
          case WeightType::kF32:
            bound = 0;
            break;
          case WeightType::kF16:
            bound = std::fabs(v) * 0x1p-11f + 1e-7f;
            break;
          case WeightType::kBF16:
            bound = std::fabs(v) * 0x1p-8f;
            break;
          // Half a step of d, plus the f16 rounding of d itself (relative 2^-11 of amax).
          case WeightType::kQ8_0:
            bound = amax / 127 * 0.5f + amax * 0x1p-10f;
            break;
          // One step of d at the clipped top end (q=16 -> 15), plus f16 rounding of d.
          case WeightType::kQ4_0:
            bound = amax / 8 * 1.0f + amax * 0x1p-9f;
            break;
          default:
            break;
        }
        EXPECT_LE(std::fabs(back[b * 32 + j] - v), bound)
            << TraitsOf(type).name << " at " << b * 32 + j;
      }
    }
  }
}

// The K-quants round to nearest (not ggml's scale search): within each super-block,
// Q4_K is off by at most half a step of its sub-block (range / 15 / 2) plus what the
// 6-bit scale and min lose (half a step of d and of dmin, up to 15 times), Q6_K by
// half a step (amax / 31 / 2) plus half a step of d, 31 times. Zero and constant
// rows, shifted and one-signed ones, come back as zero and near-constant.
TEST(QuantizeTest, KQuantsRoundTripWithinTheirSteps) {
  std::mt19937 rng(38);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 256 * 6;
  for (float shift : {0.0f, 0.7f, -3.0f}) {
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng) + shift;
    for (int j = 0; j < 256; ++j) x[256 * 5 + j] = j < 128 ? 0.0f : 1e-3f * static_cast<float>(j);
    for (WeightType type : {WeightType::kQ4_K, WeightType::kQ6_K}) {
      SCOPED_TRACE(std::string(TraitsOf(type).name) + " shift " + std::to_string(shift));
      ASSERT_TRUE(CanQuantize(type));
      std::vector<uint8_t> q(*RowBytes(type, n));
      QuantizeRow(type, x.data(), n, q.data());
      std::vector<float> back(n);
      DequantizeRow(type, q.data(), n, back.data());
      for (int64_t b = 0; b < n / 256; ++b) {
        float lo = 0, hi = 0, amax = 0;
        for (int j = 0; j < 256; ++j) {
          lo = std::min(lo, x[b * 256 + j]);
          hi = std::max(hi, x[b * 256 + j]);
          amax = std::max(amax, std::fabs(x[b * 256 + j]));
        }
        const float bound = type == WeightType::kQ4_K
                                ? (hi - lo) / 15 * 0.5f + 15 * 0.5f * ((hi - lo) / 15 / 63) +
                                      0.5f * (-lo / 63) + amax * 0x1p-9f
                                : amax / 31 * 0.5f + 31 * 0.5f * (amax / 31 / 127) + amax * 0x1p-9f;
        for (int j = 0; j < 256; ++j) {
          EXPECT_LE(std::fabs(back[b * 256 + j] - x[b * 256 + j]), bound) << b * 256 + j;
        }
      }
      for (int j = 0; j < 128; ++j) EXPECT_EQ(back[256 * 5 + j], 0.0f) << j;
    }
  }
  std::vector<float> zero(256, 0.0f), back(256, 1.0f);
  for (WeightType type : {WeightType::kQ4_K, WeightType::kQ6_K}) {
    std::vector<uint8_t> q(*RowBytes(type, 256), 0xAB);
    QuantizeRow(type, zero.data(), 256, q.data());
    DequantizeRow(type, q.data(), 256, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
  }
}

TEST(QuantizeTest, Q4_KKnownBlock) {
  // One super-block: d = 0.5, dmin = 0.25, sub-block scales 1..8, mins 8..1 (6-bit,
  // packed as ggml packs them), qs nibbles = l % 16.
  std::vector<uint8_t> block(144, 0);
  const uint16_t d = F32ToF16(0.5f), dmin = F32ToF16(0.25f);
  std::memcpy(block.data(), &d, 2);
  std::memcpy(block.data() + 2, &dmin, 2);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(1 + j + 16 * (j & 1) + 32 * (j >= 6));  // exercise high bits
    mn[j] = static_cast<uint8_t>(8 - j + 48 * (j == 7));
  }
  uint8_t* s = block.data() + kQ4KScalesOffset;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; ++i) block[kQ4KQsOffset + i] = static_cast<uint8_t>(i * 7);
  for (int j = 0; j < 8; ++j) {
    uint8_t a, b;
    Q4KScaleMin(j, s, &a, &b);
    EXPECT_EQ(a, sc[j]) << j;
    EXPECT_EQ(b, mn[j]) << j;
  }
  std::vector<float> y(256);
  DequantizeRow(WeightType::kQ4_K, block.data(), 256, y.data());
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, group = e / 64, l = e % 32;
    const uint8_t byte = block[kQ4KQsOffset + group * 32 + l];
    const int q = (sub % 2 == 0) ? (byte & 15) : (byte >> 4);
    EXPECT_EQ(y[e], 0.5f * sc[sub] * q - 0.25f * mn[sub]) << e;
  }
}

TEST(QuantizeTest, Q6_KKnownBlock) {
  std::vector<uint8_t> block(210, 0);
  std::mt19937 rng(3);
  for (int i = 0; i < 192; ++i) block[i] = static_cast<uint8_t>(rng());
  for (int i = 0; i < 16; ++i) block[kQ6KScalesOffset + i] = static_cast<uint8_t>(i * 9 - 70);
  const uint16_t d = F32ToF16(0.125f);
  std::memcpy(block.data() + kQ6KDOffset, &d, 2);
  std::vector<float> y(256);
  DequantizeRow(WeightType::kQ6_K, block.data(), 256, y.data());
  // Element e: half h = e/128, within it quarter k = (e%128)/32 and l = e%32.
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t lbyte = block[h * 64 + (k % 2) * 32 + l];
    const int low = k < 2 ? (lbyte & 15) : (lbyte >> 4);
    const int high = (block[kQ6KQhOffset + h * 32 + l] >> (2 * k)) & 3;
    const int q = (low | (high << 4)) - 32;
    const int scale = static_cast<int8_t>(block[kQ6KScalesOffset + h * 8 + k * 2 + l / 16]);
    EXPECT_EQ(y[e], 0.125f * static_cast<float>(scale) * static_cast<float>(q)) << e;
  }
}

}  // namespace
}  // namespace tessera::kernels
