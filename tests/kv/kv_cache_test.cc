#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/half.h"

namespace tessera::kv {
namespace {

using kernels::KvType;

KvCacheShape SmallShape(KvType type) {
  return {.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .type = type};
}

TEST(KvCacheTest, BudgetArithmetic) {
  KvCacheShape shape = SmallShape(KvType::kF16);
  // 2 (K,V) * 3 layers * 4 tokens * 16 elems * 2 bytes
  EXPECT_EQ(shape.BytesPerBlock(), 2 * 3 * 4 * 16 * 2);
  EXPECT_EQ(shape.BytesPerToken(), 2 * 3 * 16 * 2);
  EXPECT_EQ(NumBlocksForBudget(shape, shape.BytesPerBlock() * 10 + 5), 10);
  EXPECT_EQ(NumBlocksForBudget(shape, -1), 0);
  Result<KvCache> cache = KvCache::Create(shape, 10);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->size_bytes(), shape.BytesPerBlock() * 10);
  EXPECT_EQ(cache->num_slots(), 40);
}

TEST(KvCacheTest, RejectsBadShapes) {
  KvCacheShape shape = SmallShape(KvType::kF32);
  shape.head_dim = 0;
  EXPECT_EQ(KvCache::Create(shape, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(SmallShape(KvType::kF32), -1).status().code(),
            StatusCode::kInvalidArgument);
}

class KvCacheTypeTest : public ::testing::TestWithParam<KvType> {};

TEST_P(KvCacheTypeTest, StoreLoadRoundTripsEverySlotAndLayer) {
  KvCacheShape shape = SmallShape(GetParam());
  KvCache cache = std::move(KvCache::Create(shape, 5)).value();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  const size_t n = static_cast<size_t>(shape.row_elems());
  // [layers, slots, 2, n]
  std::vector<float> written(static_cast<size_t>(shape.num_layers * cache.num_slots()) * 2 * n);
  for (float& x : written) x = dist(rng);
  auto row = [&](int layer, int64_t slot, int kv) {
    return std::span<float>(written).subspan(((layer * cache.num_slots() + slot) * 2 + kv) * n, n);
  };
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    for (int64_t slot = 0; slot < cache.num_slots(); ++slot) {
      cache.Store(layer, slot, row(layer, slot, 0), row(layer, slot, 1));
    }
  }
  std::vector<float> k(n), v(n);
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    for (int64_t slot = 0; slot < cache.num_slots(); ++slot) {
      cache.Load(layer, slot, k, v);
      for (size_t i = 0; i < n; ++i) {
        float want_k = row(layer, slot, 0)[i], want_v = row(layer, slot, 1)[i];
        if (GetParam() == KvType::kF16) {
          want_k = F16ToF32(F32ToF16(want_k));
          want_v = F16ToF32(F32ToF16(want_v));
        }
        ASSERT_EQ(k[i], want_k) << "layer " << layer << " slot " << slot << " i " << i;
        ASSERT_EQ(v[i], want_v) << "layer " << layer << " slot " << slot << " i " << i;
      }
    }
  }
  // Pool layout: slot s of layer l starts s * n elements into k_pool(l).
  const int64_t eb = shape.elem_bytes();
  const auto* pool = static_cast<const uint8_t*>(cache.k_pool(2));
  if (GetParam() == KvType::kF32) {
    EXPECT_EQ(reinterpret_cast<const float*>(pool + 13 * n * eb)[3], row(2, 13, 0)[3]);
  } else {
    EXPECT_EQ(F16ToF32(reinterpret_cast<const uint16_t*>(pool + 13 * n * eb)[3]),
              F16ToF32(F32ToF16(row(2, 13, 0)[3])));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, KvCacheTypeTest, ::testing::Values(KvType::kF32, KvType::kF16));

}  // namespace
}  // namespace tessera::kv
