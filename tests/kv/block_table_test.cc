#include "kv/block_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// Context parallelism's placement in miniature: table indices in pairs, the pairs
// alternating between two partitions (index / 2 % 2).
int32_t PairsZigZag(int64_t index) { return static_cast<int32_t>(index / 2 % 2); }

TEST(BlockTableTest, PartitionedReserveTakesEachIndexFromItsPartition) {
  BlockAllocator allocator(8, 2, PairsZigZag);  // partition 0: ids 0-3, partition 1: 4-7
  BlockTable table(4);
  ASSERT_TRUE(table.Reserve(allocator, 21).ok());  // 6 blocks
  ASSERT_EQ(table.blocks().size(), 6u);
  for (size_t j = 0; j < table.blocks().size(); ++j) {
    const int32_t p = PairsZigZag(static_cast<int64_t>(j));
    EXPECT_GE(table.blocks()[j], p * 4) << "index " << j;
    EXPECT_LT(table.blocks()[j], (p + 1) * 4) << "index " << j;
  }
  EXPECT_EQ(allocator.num_free_blocks(0), 0);
  EXPECT_EQ(allocator.num_free_blocks(1), 2);
  // Growing by two more takes partition 1's last two.
  ASSERT_TRUE(table.Reserve(allocator, 32).ok());
  EXPECT_GE(table.blocks()[6], 4);
  EXPECT_GE(table.blocks()[7], 4);
  EXPECT_EQ(allocator.num_free_blocks(), 0);
  for (int64_t p = 0; p < 32; ++p) {
    EXPECT_EQ(table.SlotOf(p), table.blocks()[p / 4] * 4 + p % 4);
  }
  // Back go indices 2-7: 4 and 5 to partition 0; 2, 3, 6 and 7 to partition 1.
  table.Truncate(allocator, 8);
  EXPECT_EQ(allocator.num_free_blocks(0), 2);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);
  table.Release(allocator);
  EXPECT_EQ(allocator.num_free_blocks(0), 4);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);
}

// Enough free blocks in all, but not in one partition: ResourceExhausted naming
// that partition, and neither the table nor the pool changes.
TEST(BlockTableTest, PartitionedReserveIsAllOrNothingPerPartition) {
  BlockAllocator allocator(12, 2, PairsZigZag);  // 6 blocks a partition
  BlockTable a(4), b(4);
  ASSERT_TRUE(a.Reserve(allocator, 20).ok());  // indices 0-4: partition 0 × 3, 1 × 2
  EXPECT_EQ(allocator.num_free_blocks(0), 3);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);
  // 7 blocks: indices 0, 1, 4, 5 from partition 0 (4 > 3 free), 2, 3, 6 from 1.
  Status status = b.Reserve(allocator, 28);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("partition (cp rank) 0"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("only 3 of its 6 are free"), std::string::npos)
      << status.message();
  EXPECT_EQ(b.blocks().size(), 0u);
  EXPECT_EQ(allocator.num_free_blocks(0), 3);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);
  EXPECT_EQ(allocator.num_free_blocks(), 7);

  // Growing a table: the same, from its current length.
  ASSERT_TRUE(b.Reserve(allocator, 8).ok());  // indices 0, 1: partition 0
  EXPECT_EQ(allocator.num_free_blocks(0), 1);
  const std::vector<BlockId> before(b.blocks().begin(), b.blocks().end());
  status = b.Reserve(allocator, 24);  // indices 2-5: partition 1 × 2, 0 × 2 (1 free)
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("partition (cp rank) 0"), std::string::npos) << status.message();
  EXPECT_EQ(std::vector<BlockId>(b.blocks().begin(), b.blocks().end()), before);
  EXPECT_EQ(allocator.num_free_blocks(0), 1);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);
  a.Release(allocator);
  b.Release(allocator);
  EXPECT_EQ(allocator.num_free_blocks(0), 6);
  EXPECT_EQ(allocator.num_free_blocks(1), 6);
}

TEST(BlockTableTest, PartitionedReserveNamesTheShortPartition) {
  // Every index on partition 1: it runs out while partition 0 is all free.
  BlockAllocator allocator(6, 2, [](int64_t) { return 1; });
  BlockTable table(4);
  const Status status = table.Reserve(allocator, 13);  // 4 blocks, 6 free in all
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("need 4 more blocks of 4 tokens on partition (cp rank) 1, only "
                                  "3 of its 3 are free"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(table.blocks().size(), 0u);
  EXPECT_EQ(allocator.num_free_blocks(), 6);
  ASSERT_TRUE(table.Reserve(allocator, 12).ok());
  for (BlockId block : table.blocks()) EXPECT_GE(block, 3);
  table.Release(allocator);
}

// Data-parallel attention: a pool of two partitions without placement, each table
// bound to one. Every block a bound table reserves — growing, and again after a
// Truncate — comes from its partition; running out there is ResourceExhausted
// naming the DP rank, with the table and pool unchanged, though the other
// partition has room.
TEST(BlockTableTest, BoundTableTakesEveryBlockFromItsPartition) {
  BlockAllocator allocator(8, 2, {});  // DP rank 0: ids 0-3, DP rank 1: 4-7
  BlockTable a(4), b(4);
  EXPECT_EQ(a.partition(), -1);
  a.set_partition(1);
  b.set_partition(0);
  EXPECT_EQ(a.partition(), 1);
  ASSERT_TRUE(a.Reserve(allocator, 5).ok());   // 2 blocks
  ASSERT_TRUE(b.Reserve(allocator, 4).ok());   // 1 block
  ASSERT_TRUE(a.Reserve(allocator, 12).ok());  // grows by 1
  for (BlockId block : a.blocks()) EXPECT_GE(block, 4);
  for (BlockId block : b.blocks()) EXPECT_LT(block, 4);
  EXPECT_EQ(allocator.num_free_blocks(0), 3);
  EXPECT_EQ(allocator.num_free_blocks(1), 1);

  const std::vector<BlockId> before(a.blocks().begin(), a.blocks().end());
  Status status = a.Reserve(allocator, 20);  // needs 2 more, 1 free on rank 1 (4 in all)
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("need 2 more blocks of 4 tokens on partition (DP rank) 1, only "
                                  "1 of its 4 are free"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(std::vector<BlockId>(a.blocks().begin(), a.blocks().end()), before);
  EXPECT_EQ(allocator.num_free_blocks(0), 3);
  EXPECT_EQ(allocator.num_free_blocks(1), 1);

  a.Truncate(allocator, 4);  // gives two back to rank 1
  EXPECT_EQ(allocator.num_free_blocks(1), 3);
  ASSERT_TRUE(a.Reserve(allocator, 16).ok());  // all of rank 1
  for (BlockId block : a.blocks()) EXPECT_GE(block, 4);
  EXPECT_EQ(allocator.num_free_blocks(1), 0);
  a.Release(allocator);
  b.Release(allocator);
  EXPECT_EQ(allocator.num_free_blocks(0), 4);
  EXPECT_EQ(allocator.num_free_blocks(1), 4);

  // Released, a table may be bound to the other partition (a preempted sequence
  // re-admitted on another rank).
  a.set_partition(0);
  ASSERT_TRUE(a.Reserve(allocator, 16).ok());
  for (BlockId block : a.blocks()) EXPECT_LT(block, 4);
  a.Release(allocator);
}

// A bound table evicts only its partition's cached blocks, and takes a cached
// block of its partition (a prefix hit on its DP rank).
TEST(BlockTableTest, BoundTableEvictsAndSharesWithinItsPartition) {
  BlockAllocator allocator(4, 2, {});  // rank 0: ids 0-1, rank 1: 2-3
  const std::vector<int32_t> tokens = {1, 2};
  const BlockHash root = RootBlockHash("test");
  BlockTable writer(2), reader(2), other(2);
  writer.set_partition(1);
  reader.set_partition(1);
  other.set_partition(0);
  ASSERT_TRUE(writer.Reserve(allocator, 4).ok());
  const BlockId cached = writer.blocks()[0];
  ASSERT_TRUE(allocator.Register(cached, root, HashBlock(root, tokens), tokens));
  writer.Release(allocator);                      // one cached, one free on rank 1
  ASSERT_TRUE(other.Reserve(allocator, 4).ok());  // rank 0's two: no eviction
  EXPECT_TRUE(allocator.IsCached(cached));
  reader.AppendCached(allocator, cached);
  EXPECT_EQ(allocator.RefCount(cached), 1);
  reader.Release(allocator);
  ASSERT_TRUE(writer.Reserve(allocator, 4).ok());  // rank 1's free one, then the cached one
  EXPECT_FALSE(allocator.IsCached(cached));
  EXPECT_EQ(allocator.num_evictions(), 1);
  writer.Release(allocator);
  other.Release(allocator);
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

// Binding a table that holds blocks, or giving a bound table a block of another
// partition, would split a sequence over two DP ranks' caches: a bug.
TEST(BlockTableDeathTest, BindingAFilledTableOrMixingPartitionsIsABug) {
  BlockAllocator allocator(4, 2, {});
  BlockTable table(4), other(4);
  ASSERT_TRUE(table.Reserve(allocator, 1).ok());  // unbound: partition 0
  EXPECT_DEATH(table.set_partition(1), "binding a table that holds 1 blocks");
  other.set_partition(1);
  EXPECT_DEATH(other.AppendShared(allocator, table.blocks()[0]),
               "block 0 of partition 0 appended to a table bound to partition 1");
  table.Release(allocator);
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
