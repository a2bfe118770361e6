#include "kv/block_table.h"

#include <gtest/gtest.h>

namespace tessera::kv {
namespace {

TEST(BlockTableTest, ReserveAllocatesWholeBlocksAndMapsSlots) {
  BlockAllocator allocator(8);
  BlockTable table(4);
  ASSERT_TRUE(table.Reserve(allocator, 0).ok());
  EXPECT_EQ(table.blocks().size(), 0u);
  ASSERT_TRUE(table.Reserve(allocator, 5).ok());
  EXPECT_EQ(table.blocks().size(), 2u);
  EXPECT_EQ(table.capacity_tokens(), 8);
  ASSERT_TRUE(table.Reserve(allocator, 8).ok());  // still fits
  EXPECT_EQ(table.blocks().size(), 2u);
  for (int64_t p = 0; p < 8; ++p) {
    EXPECT_EQ(table.SlotOf(p), table.blocks()[p / 4] * 4 + p % 4);
  }
  table.Release(allocator);
  EXPECT_EQ(allocator.num_free_blocks(), 8);
}

TEST(BlockTableTest, ReserveIsAllOrNothing) {
  BlockAllocator allocator(3);
  BlockTable a(16), b(16);
  ASSERT_TRUE(a.Reserve(allocator, 32).ok());
  Status status = b.Reserve(allocator, 33);  // needs 3, 1 free
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("only 1 of 3 are free"), std::string::npos) << status.message();
  EXPECT_EQ(b.blocks().size(), 0u);
  EXPECT_EQ(allocator.num_free_blocks(), 1);
  ASSERT_TRUE(b.Reserve(allocator, 16).ok());
  a.Release(allocator);
  b.Release(allocator);
}

TEST(BlockTableTest, SharedPrefixBlocksSurviveTheFirstOwner) {
  BlockAllocator allocator(4);
  BlockTable parent(2), child(2);
  ASSERT_TRUE(parent.Reserve(allocator, 4).ok());
  for (BlockId block : parent.blocks()) child.AppendShared(allocator, block);
  ASSERT_TRUE(child.Reserve(allocator, 5).ok());  // one more exclusive block
  EXPECT_FALSE(child.IsBlockExclusive(allocator, 0));
  EXPECT_TRUE(child.IsBlockExclusive(allocator, 4));
  parent.Release(allocator);
  EXPECT_TRUE(child.IsBlockExclusive(allocator, 0));
  EXPECT_EQ(allocator.num_free_blocks(), 1);
  child.Truncate(allocator, 3);  // keeps blocks 0..1
  EXPECT_EQ(child.blocks().size(), 2u);
  EXPECT_EQ(allocator.num_free_blocks(), 2);
  child.Release(allocator);
  EXPECT_EQ(allocator.num_free_blocks(), 4);
}

TEST(BlockTableDeathTest, SlotPastTheReservationIsABug) {
  BlockAllocator allocator(1);
  BlockTable table(4);
  ASSERT_TRUE(table.Reserve(allocator, 1).ok());
  EXPECT_DEATH(table.SlotOf(4), "outside the 4 reserved tokens");
  table.Release(allocator);
}

}  // namespace
}  // namespace tessera::kv
