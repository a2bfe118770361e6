#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/reference/reference.h"
#include "test_util.h"

namespace tessera::kernels {
namespace {

using testing::ForEachTarget;
using testing::RandomFloats;

TEST(RopeTest, LayoutsRotateTheRightPairs) {
  RopeParams p;
  p.n_dims = 4;
  std::vector<float> x = {1, 0, 0, 0, 7, 8};  // head_dim 6: dims 4, 5 not rotated
  Rope(p, 1, x.data(), 1, 6);                 // theta_0 = pos = 1 rad
  EXPECT_FLOAT_EQ(x[0], std::cos(1.0f));
  EXPECT_FLOAT_EQ(x[1], std::sin(1.0f));
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_EQ(x[4], 7.0f);
  EXPECT_EQ(x[5], 8.0f);
  p.layout = RopeLayout::kNeox;
  x = {1, 0, 0, 0, 7, 8};
  Rope(p, 1, x.data(), 1, 6);
  EXPECT_FLOAT_EQ(x[0], std::cos(1.0f));
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_FLOAT_EQ(x[2], std::sin(1.0f));
  // Second pair of the normal layout: theta_1 = pos · base^(-2/4) = 0.01 at pos 1.
  p.layout = RopeLayout::kNormal;
  x = {0, 0, 1, 0, 0, 0};
  Rope(p, 1, x.data(), 1, 6);
  EXPECT_FLOAT_EQ(x[2], std::cos(0.01f));
  EXPECT_FLOAT_EQ(x[3], std::sin(0.01f));
}

// The reference computes theta in double; ggml's f32 recurrence (and f32 cos/sin
// of the rounded angle) is off by about pos·2^-21 rad at most, so the tolerance
// grows with pos.
TEST(RopeTest, MatchesReference) {
  std::mt19937 rng(6);
  std::vector<float> freq_factors(64);
  for (int i = 0; i < 64; ++i) freq_factors[i] = 1.0f + 0.1f * (i % 7);
  ForEachTarget([&] {
    for (RopeLayout layout : {RopeLayout::kNormal, RopeLayout::kNeox}) {
      for (int variant = 0; variant < 4; ++variant) {
        for (int64_t head_dim : {64, 128, 20}) {
          for (int n_dims : {static_cast<int>(head_dim), static_cast<int>(head_dim / 2)}) {
            RopeParams p;
            p.n_dims = n_dims;
            p.layout = layout;
            p.freq_base = variant == 0 ? 10000.0f : 500000.0f;
            if (variant == 1) p.freq_scale = 0.25f;  // linear scaling ×4
            if (variant == 2) {                      // YaRN ×4 from a 4096 context
              p.freq_scale = 0.25f;
              p.ext_factor = 1.0f;
              p.n_ctx_orig = 4096;
            }
            if (variant == 3)
              p.freq_factors = std::span<const float>(freq_factors).first(n_dims / 2);
            for (int64_t pos : {0, 1, 17, 100, 1000}) {
              const int64_t n_heads = 3;
              auto x = RandomFloats(rng, n_heads * head_dim);
              auto ref = x;
              Rope(p, pos, x.data(), n_heads, head_dim);
              reference::Rope(p, pos, ref.data(), n_heads, head_dim);
              for (int64_t i = 0; i < n_heads * head_dim; ++i) {
                ASSERT_NEAR(x[i], ref[i], 2e-6 + 1e-6 * pos)
                    << "variant " << variant << " layout " << static_cast<int>(layout)
                    << " head_dim " << head_dim << " n_dims " << n_dims << " pos " << pos << " i "
                    << i;
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace tessera::kernels
