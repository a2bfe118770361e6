#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kv/block_hash.h"

namespace tessera::kv {
namespace {

TEST(BlockAllocatorTest, HandsOutEveryBlockOnceThenRunsOut) {
  BlockAllocator allocator(5);
  std::set<BlockId> seen;
  for (int i = 0; i < 5; ++i) {
    std::optional<BlockId> block = allocator.Allocate();
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ(*block, i);  // lowest id first
    EXPECT_EQ(allocator.RefCount(*block), 1);
    seen.insert(*block);
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(allocator.num_free_blocks(), 0);
  EXPECT_FALSE(allocator.Allocate().has_value());
}

TEST(BlockAllocatorTest, SharedBlockIsFreedByTheLastOwner) {
  BlockAllocator allocator(2);
  BlockId block = *allocator.Allocate();
  allocator.AddRef(block);
  allocator.AddRef(block);
  EXPECT_EQ(allocator.RefCount(block), 3);
  allocator.Release(block);
  allocator.Release(block);
  EXPECT_EQ(allocator.num_free_blocks(), 1);
  allocator.Release(block);
  EXPECT_EQ(allocator.RefCount(block), 0);
  EXPECT_EQ(allocator.num_free_blocks(), 2);
  // The most recently freed block comes back first.
  EXPECT_EQ(*allocator.Allocate(), block);
}

TEST(BlockAllocatorTest, ZeroBlocks) {
  BlockAllocator allocator(0);
  EXPECT_FALSE(allocator.Allocate().has_value());
  EXPECT_EQ(allocator.num_used_blocks(), 0);
}

TEST(BlockAllocatorTest, OnePartitionIsThePlainPool) {
  BlockAllocator allocator(4);
  EXPECT_EQ(allocator.num_partitions(), 1);
  EXPECT_EQ(allocator.PartitionOfIndex(0), 0);
  EXPECT_EQ(allocator.PartitionOfIndex(1000), 0);
  EXPECT_EQ(*allocator.Allocate(0), 0);
  EXPECT_EQ(*allocator.Allocate(), 1);
  EXPECT_EQ(allocator.num_free_blocks(0), 2);
  EXPECT_EQ(allocator.num_free_blocks(), 2);
}

// Context parallelism: partition p owns ids [p × per, (p + 1) × per) and Allocate(p)
// hands out only those, lowest first, running out on its own.
TEST(BlockAllocatorTest, PartitionsHandOutOnlyTheirOwnIds) {
  BlockAllocator allocator(12, 3, [](int64_t index) { return static_cast<int32_t>(index % 3); });
  ASSERT_EQ(allocator.num_partitions(), 3);
  EXPECT_EQ(allocator.num_blocks(), 12);
  EXPECT_EQ(allocator.PartitionOfIndex(4), 1);
  EXPECT_EQ(allocator.PartitionOfIndex(8), 2);
  std::vector<BlockId> ones;
  for (int i = 0; i < 4; ++i) {
    std::optional<BlockId> block = allocator.Allocate(1);
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ(*block, 4 + i);  // partition 1's ids, lowest first
    ones.push_back(*block);
  }
  // Partition 1 is exhausted though the others have room.
  EXPECT_FALSE(allocator.Allocate(1).has_value());
  EXPECT_EQ(allocator.num_free_blocks(1), 0);
  EXPECT_EQ(allocator.num_free_blocks(0), 4);
  EXPECT_EQ(allocator.num_free_blocks(2), 4);
  EXPECT_EQ(allocator.num_free_blocks(), 8);
  EXPECT_EQ(allocator.num_used_blocks(), 4);

  for (int i = 0; i < 4; ++i) {
    std::optional<BlockId> block = allocator.Allocate(2);
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ(*block, 8 + i);
  }
  EXPECT_FALSE(allocator.Allocate(2).has_value());
  EXPECT_EQ(*allocator.Allocate(0), 0);
  EXPECT_EQ(allocator.num_free_blocks(), 3);

  // A released block goes back to its own partition, and comes out of it again.
  allocator.Release(6);
  EXPECT_EQ(allocator.num_free_blocks(1), 1);
  EXPECT_EQ(allocator.num_free_blocks(0), 3);
  EXPECT_EQ(allocator.num_free_blocks(2), 0);
  EXPECT_EQ(allocator.num_free_blocks(), 4);
  EXPECT_FALSE(allocator.Allocate(2).has_value());
  EXPECT_EQ(*allocator.Allocate(1), 6);
  EXPECT_FALSE(allocator.Allocate(1).has_value());
  allocator.Release(11);
  EXPECT_EQ(allocator.num_free_blocks(2), 1);
  EXPECT_EQ(allocator.num_free_blocks(1), 0);
  EXPECT_EQ(*allocator.Allocate(2), 11);
}

// A cached block with no owner counts as free in its own partition, and only an
// Allocate of that partition evicts it.
TEST(BlockAllocatorTest, PartitionsEvictOnlyTheirOwnCachedBlocks) {
  BlockAllocator allocator(4, 2, [](int64_t index) { return static_cast<int32_t>(index % 2); });
  const std::vector<int32_t> tokens = {1, 2, 3};
  const BlockHash root = RootBlockHash("");
  const BlockHash hash = HashBlock(root, tokens);
  const BlockId cached = *allocator.Allocate(0);
  ASSERT_EQ(cached, 0);
  ASSERT_TRUE(allocator.Register(cached, root, hash, tokens));
  allocator.Release(cached);
  EXPECT_EQ(allocator.num_evictable_blocks(), 1);
  EXPECT_EQ(allocator.num_free_blocks(0), 2);
  EXPECT_EQ(allocator.num_free_blocks(1), 2);
  EXPECT_EQ(*allocator.Allocate(1), 2);
  EXPECT_EQ(*allocator.Allocate(1), 3);
  EXPECT_FALSE(allocator.Allocate(1).has_value());  // partition 0's cached block stays
  EXPECT_TRUE(allocator.IsCached(cached));
  EXPECT_EQ(allocator.num_evictions(), 0);
  EXPECT_EQ(*allocator.Allocate(0), 1);  // the free block before the cached one
  EXPECT_EQ(*allocator.Allocate(0), cached);
  EXPECT_EQ(allocator.num_evictions(), 1);
  EXPECT_FALSE(allocator.IsCached(cached));
  EXPECT_EQ(allocator.num_free_blocks(), 0);
}

TEST(BlockAllocatorDeathTest, ReleasingAFreeBlockIsABug) {
  BlockAllocator allocator(1);
  EXPECT_DEATH(allocator.Release(0), "free block");
  EXPECT_DEATH(allocator.AddRef(0), "free block");
  EXPECT_DEATH(allocator.RefCount(7), "block 7");
}

TEST(BlockAllocatorDeathTest, PartitionsMustDivideThePool) {
  EXPECT_DEATH(BlockAllocator(10, 3, {}), "3 partitions of 10 blocks");
  BlockAllocator allocator(6, 3, [](int64_t) { return 0; });
  EXPECT_DEATH(allocator.Allocate(3), "partition 3");
  EXPECT_DEATH(allocator.num_free_blocks(-1), "partition -1");
}

}  // namespace
}  // namespace tessera::kv
