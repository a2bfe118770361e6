// CacheEventLog fed by a BlockAllocator: registrations and evictions arrive in
// order, a reader that follows the log ends with exactly the allocator's cached
// set, and one that fell behind (or never read) gets a snapshot instead.
#include "kv/cache_event_log.h"

#include <gtest/gtest.h>

#include <numeric>
#include <unordered_set>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/block_hash.h"

namespace tessera::kv {
namespace {

using HashSet = std::unordered_set<BlockHash, BlockHashHasher>;

std::vector<int32_t> Tokens(int32_t first) {
  std::vector<int32_t> t(4);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Applies a batch to a reader's copy of the cached set.
uint64_t Follow(const CacheEventLog& log, uint64_t after, HashSet* copy) {
  const CacheEventBatch batch = log.Read(after, 3);  // small pages: several reads
  if (batch.snapshot) copy->clear();
  for (const BlockHash& h : batch.cached) copy->insert(h);
  for (const CacheEvent& e : batch.events) {
    if (e.stored) {
      copy->insert(e.hash);
    } else {
      copy->erase(e.hash);
    }
  }
  return batch.next;
}

TEST(CacheEventLogTest, FollowsRegistrationsAndEvictions) {
  CacheEventLog log;
  BlockAllocator allocator(3);
  allocator.SetEventLog(&log);
  const BlockHash root = RootBlockHash("s");
  HashSet copy;
  // A first read of a log is always a snapshot (any cursor past its end).
  CacheEventBatch first = log.Read(UINT64_MAX, 100);
  EXPECT_TRUE(first.snapshot);
  EXPECT_TRUE(first.cached.empty());
  uint64_t cursor = first.next;

  std::vector<BlockHash> hashes;
  for (int i = 0; i < 5; ++i) {  // 5 blocks through a pool of 3: 2 evictions
    const std::optional<BlockId> block = allocator.Allocate();
    ASSERT_TRUE(block.has_value());
    hashes.push_back(HashBlock(root, Tokens(10 * i)));
    ASSERT_TRUE(allocator.Register(*block, root, hashes.back(), Tokens(10 * i)));
    allocator.Release(*block);
  }
  EXPECT_EQ(allocator.num_evictions(), 2);
  EXPECT_EQ(log.num_cached(), 3u);
  while (true) {
    const uint64_t next = Follow(log, cursor, &copy);
    if (next == cursor) break;
    cursor = next;
  }
  EXPECT_EQ(copy, HashSet(hashes.begin() + 2, hashes.end()));  // LRU: the first two left

  allocator.ClearCache();
  cursor = Follow(log, cursor, &copy);
  cursor = Follow(log, cursor, &copy);
  EXPECT_TRUE(copy.empty());
}

TEST(CacheEventLogTest, AReaderTooFarBehindGetsASnapshot) {
  CacheEventLog log(/*capacity=*/4);
  const BlockHash root = RootBlockHash("s");
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 6; ++i) {
    hashes.push_back(HashBlock(root, Tokens(i)));
    log.Stored(hashes.back());
  }
  log.Removed(hashes[0]);
  // 7 events, the log keeps the last 4: cursor 0 is gone.
  CacheEventBatch batch = log.Read(0, 100);
  ASSERT_TRUE(batch.snapshot);
  EXPECT_EQ(HashSet(batch.cached.begin(), batch.cached.end()),
            HashSet(hashes.begin() + 1, hashes.end()));
  EXPECT_EQ(batch.next, 7u);
  // From cursor 3 on, the events are still there.
  batch = log.Read(3, 100);
  ASSERT_FALSE(batch.snapshot);
  ASSERT_EQ(batch.events.size(), 4u);
  EXPECT_TRUE(batch.events[0].stored);
  EXPECT_EQ(batch.events[0].hash, hashes[3]);
  EXPECT_FALSE(batch.events[3].stored);
  EXPECT_EQ(batch.events[3].hash, hashes[0]);
  // Nothing new: an empty batch, same cursor.
  batch = log.Read(7, 100);
  EXPECT_FALSE(batch.snapshot);
  EXPECT_TRUE(batch.events.empty());
  EXPECT_EQ(batch.next, 7u);
}

}  // namespace
}  // namespace tessera::kv
