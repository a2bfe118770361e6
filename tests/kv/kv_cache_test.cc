#include "kv/kv_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>
#include <vector>

#include "base/half.h"
#include "base/populate.h"

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
  // Pool layout: blocks hold every layer's K and V, [layers, 2, heads, block_size,
  // head_dim]; element d of head h at slot s of layer l's K lies at
  // (s / block_size · 2 · layers + 2 · l) · block elements + (h · block_size + s %
  // block_size) · head_dim + d from the start (layer 0's K pool).
  const int64_t eb = shape.elem_bytes();
  const auto* pool = static_cast<const uint8_t*>(cache.k_pool(0));
  const int64_t slot = 13, h = 1, d = 3, layer = 2;
  const int64_t block_elems = shape.block_size * shape.row_elems();
  const int64_t index = (slot / shape.block_size * 2 * shape.num_layers + 2 * layer) * block_elems +
                        (h * shape.block_size + slot % shape.block_size) * shape.head_dim + d;
  const float want = row(layer, slot, 0)[h * shape.head_dim + d];
  if (GetParam() == KvType::kF32) {
    EXPECT_EQ(reinterpret_cast<const float*>(pool + index * eb)[0], want);
  } else {
    EXPECT_EQ(F16ToF32(reinterpret_cast<const uint16_t*>(pool + index * eb)[0]),
              F16ToF32(F32ToF16(want)));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, KvCacheTypeTest, ::testing::Values(KvType::kF32, KvType::kF16));

// Pages wholly inside [p, p + bytes): how many are resident.
int64_t ResidentPages(const void* p, int64_t bytes, int64_t* pages) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) / page * page;
  *pages = static_cast<int64_t>((end - begin) / page);
  std::vector<unsigned char> in_core(static_cast<size_t>(*pages));
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) != 0) return -1;
  int64_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return resident;
}

bool KernelPopulatesForWrite() {
  std::vector<uint8_t> page(2 * static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  return PopulateForWrite(page.data(), 1);
}

// PrepareWrite maps the blocks a step will write (every layer's K and V: one range
// per block), leaves their contents alone, and ignores block ids outside the cache.
// The cache may lie on 2 MiB transparent huge pages, so the blocks checked to stay
// unmapped lie at least 2 MiB from any block that was written or prepared.
TEST(KvCacheTest, PrepareWriteMapsTheBlocksOfTheNewPositions) {
  if (!KernelPopulatesForWrite()) GTEST_SKIP() << "madvise(MADV_POPULATE_WRITE) unsupported";
  // A block is 2 layers x 2 x 16 tokens x 512 f32 = 128 KiB (16 to a huge page); the
  // cache (128 MiB) is mapped fresh, so its pages start unmapped.
  const KvCacheShape shape{
      .num_layers = 2, .num_kv_heads = 8, .head_dim = 64, .block_size = 16, .type = KvType::kF32};
  KvCache cache = std::move(KvCache::Create(shape, 1024)).value();
  const int64_t block_bytes = shape.BytesPerBlock();
  ASSERT_EQ(block_bytes, 128 << 10);
  const auto block_at = [&](int block) {
    return static_cast<const uint8_t*>(cache.k_pool(0)) + block * block_bytes;
  };
  std::vector<float> k(512), v(512), k_back(512), v_back(512);
  for (size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i) + 0.5f;
  cache.Store(1, 2 * 16 + 5, k, v);  // block 2, written before it is prepared

  const std::vector<int32_t> table = {2, 300, 700, 900};
  cache.PrepareWrite(table, 20, 20);  // positions 20..39: the table's blocks 1 and 2
  for (int block : {300, 700, 500, 900}) {
    int64_t pages = 0;
    const int64_t resident = ResidentPages(block_at(block), block_bytes, &pages);
    ASSERT_GE(pages, 31);
    const bool prepared = block == 300 || block == 700;
    EXPECT_EQ(resident, prepared ? pages : 0) << "block " << block;
  }
  cache.Load(1, 2 * 16 + 5, k_back, v_back);
  EXPECT_EQ(k_back, k);
  EXPECT_EQ(v_back, v);
  // Ids outside the cache (a corrupt table), a negative start and positions past
  // the table are ignored; the table's blocks in range are still prepared.
  const std::vector<int32_t> bad = {-1, 1024, 1 << 30};
  cache.PrepareWrite(bad, 0, 48);
  cache.PrepareWrite(table, -16, 32);
  cache.PrepareWrite(table, 0, 0);
  int64_t pages = 0;
  EXPECT_EQ(ResidentPages(block_at(900), block_bytes, &pages), 0);
  cache.PrepareWrite(table, 60, 100);  // positions 60..159: only the table's block 3 exists
  EXPECT_EQ(ResidentPages(block_at(900), block_bytes, &pages), pages);
}

}  // namespace
}  // namespace tessera::kv
