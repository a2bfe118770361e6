#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/reference/reference.h"
#include "test_util.h"

namespace tessera::kernels {
namespace {

using testing::ForEachTarget;
using testing::RandomFloats;

constexpr int64_t kSizes[] = {1, 7, 8, 9, 63, 2048, 2053};

// Relative tolerances: the 8-lane f32 sum of n positive terms is within about
// (n/8 + 3)·2^-24 relative of the exact sum (≈ 1.6e-5 at n = 2053, halved by the
// sqrt); Highway's Exp is within a few ulp and the division adds one.
TEST(OpsTest, RmsNormMatchesReference) {
  std::mt19937 rng(1);
  ForEachTarget([&] {
    for (int64_t n : kSizes) {
      auto x = RandomFloats(rng, n, 3.0f), w = RandomFloats(rng, n);
      std::vector<float> y(n), ref(n);
      RmsNorm(x, w, 1e-5f, y);
      reference::RmsNorm(x, w, 1e-5f, ref);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-7);
      RmsNorm(x, w, 1e-5f, x);  // in place
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], y[i]);
    }
  });
}

TEST(OpsTest, SwiGluMatchesReference) {
  std::mt19937 rng(2);
  ForEachTarget([&] {
    for (int64_t n : kSizes) {
      auto g = RandomFloats(rng, n, 4.0f), u = RandomFloats(rng, n);
      if (n > 8) g[3] = 95.0f, g[4] = -95.0f, g[5] = 0.0f;  // exp range ends
      std::vector<float> y(n), ref(n);
      SwiGlu(g, u, y);
      reference::SwiGlu(g, u, ref);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(y[i], ref[i], 4e-6 * std::fabs(ref[i]) + 1e-30)
            << n << " " << i << " g=" << g[i];
      }
    }
  });
}

TEST(OpsTest, SoftmaxMatchesReference) {
  std::mt19937 rng(3);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  ForEachTarget([&] {
    for (int64_t n : kSizes) {
      auto x = RandomFloats(rng, n, 5.0f);
      if (n > 3) x[1] = kNegInf;  // masked entry
      auto ref = x;
      Softmax(x);
      reference::Softmax(ref);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(x[i], ref[i], 1e-5 * ref[i] + 1e-12) << n << " " << i;
        sum += x[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
      if (n > 3) {
        EXPECT_EQ(x[1], 0.0f);
      }
    }
    std::vector<float> masked(5, kNegInf);
    Softmax(masked);
    for (float v : masked) EXPECT_EQ(v, 0.0f);
  });
}

TEST(OpsTest, AddScaleScaleAddDot) {
  std::mt19937 rng(4);
  ForEachTarget([&] {
    for (int64_t n : kSizes) {
      auto a = RandomFloats(rng, n), b = RandomFloats(rng, n);
      std::vector<float> sum(n);
      Add(a, b, sum);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], a[i] + b[i]);
      auto scaled = a;
      Scale(scaled, 0.37f);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(scaled[i], a[i] * 0.37f);
      auto y = b;
      ScaleAdd(-1.5f, a, y);  // fused or not: within one rounding of the exact value
      for (int64_t i = 0; i < n; ++i) {
        const double exact = -1.5 * a[i] + static_cast<double>(b[i]);
        ASSERT_NEAR(y[i], exact, 2.5e-7 * (std::fabs(1.5 * a[i]) + std::fabs(b[i])));
      }
      double dot = 0, abs_dot = 0;
      for (int64_t i = 0; i < n; ++i) {
        dot += static_cast<double>(a[i]) * b[i];
        abs_dot += std::fabs(static_cast<double>(a[i]) * b[i]);
      }
      ASSERT_NEAR(Dot(a, b), dot, 1e-5 * abs_dot + 1e-30);
    }
  });
}

TEST(OpsTest, Argmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Argmax(std::vector<float>{}), -1);
  EXPECT_EQ(Argmax(std::vector<float>{1, 3, 2, 3}), 1);  // first of ties
  EXPECT_EQ(Argmax(std::vector<float>{nan, -1, -2}), 1);
  std::mt19937 rng(5);
  auto x = RandomFloats(rng, 32000);
  x[31999] = 100.0f;
  EXPECT_EQ(Argmax(x), 31999);
}

}  // namespace
}  // namespace tessera::kernels
