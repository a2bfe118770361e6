#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <set>

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

TEST(BlockAllocatorDeathTest, ReleasingAFreeBlockIsABug) {
  BlockAllocator allocator(1);
  EXPECT_DEATH(allocator.Release(0), "free block");
  EXPECT_DEATH(allocator.AddRef(0), "free block");
  EXPECT_DEATH(allocator.RefCount(7), "block 7");
}

}  // namespace
}  // namespace tessera::kv
