// The prefix cache inside BlockAllocator: hits, misses, LRU eviction order, hash
// collisions, refcounts, and the cache staying inside the pool.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/block_hash.h"
#include "kv/block_table.h"

namespace tessera::kv {
namespace {

constexpr int32_t kBlockSize = 4;

std::vector<int32_t> Tokens(int32_t first, int32_t n = kBlockSize) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockHashTest, ChainedAndSalted) {
  const BlockHash root = RootBlockHash("model-a kv=f16");
  const std::vector<int32_t> a = Tokens(0), b = Tokens(100);
  EXPECT_EQ(HashBlock(root, a), HashBlock(root, a));
  EXPECT_NE(HashBlock(root, a), HashBlock(root, b));
  // Same tokens after a different parent: a different block.
  EXPECT_NE(HashBlock(HashBlock(root, a), b), HashBlock(HashBlock(root, b), b));
  // Another salt (model, KV dtype): another chain.
  EXPECT_NE(HashBlock(RootBlockHash("model-a kv=f32"), a), HashBlock(root, a));
  // Token order matters.
  EXPECT_NE(HashBlock(root, std::vector<int32_t>{1, 2, 3, 4}),
            HashBlock(root, std::vector<int32_t>{2, 1, 3, 4}));
}

TEST(PrefixCacheTest, HitAfterReleaseMissForOtherTokens) {
  BlockAllocator allocator(4);
  const BlockHash root = RootBlockHash("s");
  const std::vector<int32_t> t = Tokens(10);
  const BlockHash h = HashBlock(root, t);
  EXPECT_FALSE(allocator.Lookup(root, h, t).has_value());
  const BlockId block = *allocator.Allocate();
  EXPECT_TRUE(allocator.Register(block, root, h, t));
  EXPECT_EQ(allocator.num_cached_blocks(), 1);
  allocator.Release(block);
  // Cached, no owner: evictable, and counted as free for Allocate.
  EXPECT_EQ(allocator.RefCount(block), 0);
  EXPECT_EQ(allocator.num_evictable_blocks(), 1);
  EXPECT_EQ(allocator.num_free_blocks(), 4);
  EXPECT_EQ(allocator.num_used_blocks(), 0);
  ASSERT_EQ(allocator.Lookup(root, h, t), block);
  const std::vector<int32_t> other = Tokens(11);
  EXPECT_FALSE(allocator.Lookup(root, HashBlock(root, other), other).has_value());
  allocator.Acquire(block);
  EXPECT_EQ(allocator.RefCount(block), 1);
  EXPECT_EQ(allocator.num_evictable_blocks(), 0);
  EXPECT_EQ(allocator.num_free_blocks(), 3);
  allocator.Acquire(block);  // a second sharer
  EXPECT_EQ(allocator.RefCount(block), 2);
  allocator.Release(block);
  EXPECT_EQ(allocator.num_evictable_blocks(), 0);
  allocator.Release(block);
  EXPECT_EQ(allocator.num_evictable_blocks(), 1);
}

TEST(PrefixCacheTest, CollisionIsAMiss) {
  BlockAllocator allocator(2);
  const BlockHash root = RootBlockHash("s");
  const std::vector<int32_t> t = Tokens(0), u = Tokens(50);
  const BlockHash h = HashBlock(root, t);
  const BlockId block = *allocator.Allocate();
  ASSERT_TRUE(allocator.Register(block, root, h, t));
  // Pretend `u` hashed to h (a collision): the stored tokens differ, so no hit.
  EXPECT_FALSE(allocator.Lookup(root, h, u).has_value());
  // Same hash and tokens but another parent: no hit either.
  EXPECT_FALSE(allocator.Lookup(RootBlockHash("other"), h, t).has_value());
  // A shorter token list (never a full block) cannot match.
  EXPECT_FALSE(allocator.Lookup(root, h, std::span(t).first(2)).has_value());
  allocator.Release(block);
}

TEST(PrefixCacheTest, DuplicateRegistrationKeepsTheFirst) {
  BlockAllocator allocator(3);
  const BlockHash root = RootBlockHash("s");
  const std::vector<int32_t> t = Tokens(0);
  const BlockHash h = HashBlock(root, t);
  const BlockId a = *allocator.Allocate(), b = *allocator.Allocate();
  EXPECT_TRUE(allocator.Register(a, root, h, t));
  EXPECT_FALSE(allocator.Register(b, root, h, t));  // same content computed twice
  EXPECT_FALSE(allocator.Register(a, root, h, t));  // already registered
  EXPECT_FALSE(allocator.IsCached(b));
  allocator.Release(b);  // private: free at once
  allocator.Release(a);  // cached: evictable
  EXPECT_EQ(allocator.num_evictable_blocks(), 1);
  EXPECT_EQ(allocator.num_cached_blocks(), 1);
  EXPECT_EQ(allocator.Lookup(root, h, t), a);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedOnlyWhenNothingIsFree) {
  BlockAllocator allocator(3);
  const BlockHash root = RootBlockHash("s");
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> t = Tokens(i * 10);
    blocks.push_back(*allocator.Allocate());
    hashes.push_back(HashBlock(root, t));
    ASSERT_TRUE(allocator.Register(blocks.back(), root, hashes.back(), t));
  }
  // Released in the order 1, 0, 2: 1 is the least recently used.
  allocator.Release(blocks[1]);
  allocator.Release(blocks[0]);
  allocator.Release(blocks[2]);
  // Touch 1 again (a hit) and drop it: now 0 is the least recently used.
  allocator.Acquire(blocks[1]);
  allocator.Release(blocks[1]);
  EXPECT_EQ(allocator.num_evictable_blocks(), 3);
  EXPECT_EQ(*allocator.Allocate(), blocks[0]);
  EXPECT_EQ(allocator.num_evictions(), 1);
  EXPECT_FALSE(allocator.IsCached(blocks[0]));
  EXPECT_FALSE(allocator.Lookup(root, hashes[0], Tokens(0)).has_value());  // forgotten
  EXPECT_EQ(*allocator.Allocate(), blocks[2]);
  EXPECT_EQ(*allocator.Allocate(), blocks[1]);
  EXPECT_FALSE(allocator.Allocate().has_value());  // never beyond the pool
  EXPECT_EQ(allocator.num_cached_blocks(), 0);
  for (BlockId b : blocks) allocator.Release(b);
  EXPECT_EQ(allocator.num_free_blocks(), 3);
}

TEST(PrefixCacheTest, FreeBlocksGoBeforeCachedOnes) {
  BlockAllocator allocator(2);
  const BlockHash root = RootBlockHash("s");
  const std::vector<int32_t> t = Tokens(0);
  const BlockId cached = *allocator.Allocate();
  ASSERT_TRUE(allocator.Register(cached, root, HashBlock(root, t), t));
  allocator.Release(cached);
  const BlockId other = *allocator.Allocate();
  EXPECT_NE(other, cached);
  EXPECT_TRUE(allocator.IsCached(cached));
  EXPECT_EQ(allocator.num_evictions(), 0);
  allocator.Release(other);
}

TEST(PrefixCacheTest, BlockTableSharesCachedPrefixAndReleasesIntoTheCache) {
  BlockAllocator allocator(4);
  const BlockHash root = RootBlockHash("s");
  BlockTable first(kBlockSize);
  ASSERT_TRUE(first.Reserve(allocator, 10).ok());  // 3 blocks: 2 full + 1 partial
  BlockHash parent = root;
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> t = Tokens(i * kBlockSize);
    const BlockHash h = HashBlock(parent, t);
    ASSERT_TRUE(allocator.Register(first.blocks()[static_cast<size_t>(i)], parent, h, t));
    parent = h;
  }
  const std::vector<BlockId> first_blocks(first.blocks().begin(), first.blocks().end());
  first.Release(allocator);
  EXPECT_EQ(allocator.num_evictable_blocks(), 2);  // the partial block is simply free
  EXPECT_EQ(allocator.num_free_blocks(), 4);

  BlockTable second(kBlockSize);
  parent = root;
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> t = Tokens(i * kBlockSize);
    const BlockHash h = HashBlock(parent, t);
    std::optional<BlockId> hit = allocator.Lookup(parent, h, t);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(*hit, first_blocks[static_cast<size_t>(i)]);
    second.AppendCached(allocator, *hit);
    parent = h;
  }
  ASSERT_TRUE(second.Reserve(allocator, 12).ok());
  EXPECT_EQ(second.blocks().size(), 3u);
  EXPECT_TRUE(second.IsBlockExclusive(allocator, 0));  // its only owner now
  EXPECT_EQ(allocator.num_used_blocks(), 3);
  // The pool's other block is free, the cache cannot hand out more.
  EXPECT_FALSE(second.Reserve(allocator, 4 * kBlockSize + 1).ok());
  second.Release(allocator);
  EXPECT_EQ(allocator.num_used_blocks(), 0);
}

TEST(PrefixCacheTest, ClearCacheFreesUnownedBlocks) {
  BlockAllocator allocator(2);
  const BlockHash root = RootBlockHash("s");
  const std::vector<int32_t> t = Tokens(0), u = Tokens(9);
  const BlockId a = *allocator.Allocate(), b = *allocator.Allocate();
  ASSERT_TRUE(allocator.Register(a, root, HashBlock(root, t), t));
  ASSERT_TRUE(allocator.Register(b, root, HashBlock(root, u), u));
  allocator.Release(a);
  allocator.ClearCache();
  EXPECT_EQ(allocator.num_cached_blocks(), 0);
  EXPECT_EQ(allocator.num_evictable_blocks(), 0);
  EXPECT_FALSE(allocator.IsCached(b));
  allocator.Release(b);
  EXPECT_EQ(allocator.num_free_blocks(), 2);
}

TEST(PrefixCacheDeathTest, AcquireOfAnUncachedBlockIsABug) {
  BlockAllocator allocator(1);
  EXPECT_DEATH(allocator.Acquire(0), "uncached block 0");
}

}  // namespace
}  // namespace tessera::kv
