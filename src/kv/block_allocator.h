// BlockAllocator: hands out fixed-size KV-cache blocks by id, with a reference
// count per block so that several sequences can share one (prefix caching, forked
// sequences, KV transfer), and the prefix cache: full blocks registered under
// their content hash (block_hash.h) stay cached when their last owner releases
// them, and are evicted least recently used first only when Allocate finds no
// free block. The cache lives inside the pool: a cached block is one of the
// num_blocks, never an extra. Layer: kv; the engine's scheduler and BlockTable call it.
// Not thread-safe: one scheduler thread owns it.
//
// Collisions: a hit needs the 128-bit chained hash, the parent's hash and the
// block's tokens all equal. Two different prefixes then share a block only if
// XXH3-128 maps two different chains to the same value at some block whose tokens
// are equal — for n blocks ever hashed, probability about n^2 / 2^129 (1e-15 at a
// trillion blocks), which is accepted.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/cache_event_log.h"

namespace tessera::kv {

using BlockId = int32_t;

// A partitioned pool (context parallelism: each cp rank's KV cache is one
// partition): where the block at index `index` of any table must live.
using BlockPlacement = std::function<int32_t(int64_t index)>;

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  // `partitions` equal ranges of ids (partition p: [p, p + 1) × num_blocks /
  // partitions), `placement` choosing each table index's; partitions must divide
  // num_blocks. One partition: the plain pool. No placement (data-parallel
  // attention: one partition per DP rank's cache): each table is bound to one
  // (BlockTable::set_partition).
  BlockAllocator(int32_t num_blocks, int32_t partitions, BlockPlacement placement);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;
  BlockAllocator(BlockAllocator&&) = default;
  BlockAllocator& operator=(BlockAllocator&&) = default;

  // A block with reference count 1, or nullopt when every block is in use. Free
  // blocks first: lowest id first after construction, then most recently freed
  // first (warm in cache); when none is free, the least recently used cached block
  // with no owner is evicted (its hash forgotten) and handed out.
  std::optional<BlockId> Allocate() { return Allocate(0); }
  // The same from one partition (evicting only its cached blocks).
  std::optional<BlockId> Allocate(int32_t partition);
  // Another owner of an allocated block (refcount + 1).
  void AddRef(BlockId block);
  // Drops one reference. At 0 a registered block stays cached (evictable, most
  // recently used); any other block is free again.
  void Release(BlockId block);

  // Prefix cache. Registers allocated block `block`, whose K/V hold `tokens` (a
  // full block) after the block hashed `parent`, under `hash` (= HashBlock(parent,
  // tokens)). False, and nothing changes, when `hash` is cached already (another
  // sequence computed the same block: this one stays private) or `block` is
  // registered already.
  bool Register(BlockId block, const BlockHash& parent, const BlockHash& hash,
                std::span<const int32_t> tokens);
  // The cached block registered under `hash` after `parent` with exactly `tokens`,
  // or nullopt. Changes nothing (Acquire takes it).
  std::optional<BlockId> Lookup(const BlockHash& parent, const BlockHash& hash,
                                std::span<const int32_t> tokens) const;
  // Takes a reference on a cached block that Lookup returned; at refcount 0 it
  // leaves the evictable list.
  void Acquire(BlockId block);
  // Forgets every cached block without an owner (they become free) and the hashes
  // of those still owned.
  void ClearCache();

  // Reports every hash registered and forgotten from now on to `log` (null: to
  // none); `log` must outlive the allocator or the next SetEventLog.
  void SetEventLog(CacheEventLog* log) { event_log_ = log; }

  int32_t RefCount(BlockId block) const;
  bool IsCached(BlockId block) const;
  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_partitions() const { return static_cast<int32_t>(free_lists_.size()); }
  // The partition table index `index` allocates from (0 in a plain pool).
  int32_t PartitionOfIndex(int64_t index) const { return placement_ ? placement_(index) : 0; }
  // The partition block `block` belongs to.
  int32_t PartitionOfId(BlockId block) const { return block / (num_blocks() / num_partitions()); }
  // Blocks Allocate can hand out: free ones and evictable cached ones.
  int32_t num_free_blocks() const { return num_free_ + static_cast<int32_t>(evictable_.size()); }
  // Those of one partition.
  int32_t num_free_blocks(int32_t partition) const;
  int32_t num_used_blocks() const { return num_blocks() - num_free_blocks(); }
  // Registered blocks (owned or not), and those of them with no owner.
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t num_evictable_blocks() const { return static_cast<int32_t>(evictable_.size()); }
  int64_t num_evictions() const { return num_evictions_; }

 private:
  struct CacheEntry {
    bool registered = false;
    BlockHash parent, hash;
    std::vector<int32_t> tokens;
    std::list<BlockId>::iterator lru_pos;  // in evictable_ while refcount is 0
  };
  void Unregister(BlockId block);

  std::vector<int32_t> ref_counts_;               // [num_blocks]
  std::vector<std::vector<BlockId>> free_lists_;  // per partition, a stack; back() is next
  int32_t num_free_ = 0;                          // in the free lists
  BlockPlacement placement_;
  std::vector<CacheEntry> entries_;  // [num_blocks]
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> by_hash_;
  std::list<BlockId> evictable_;  // registered, refcount 0; front = least recently used
  int64_t num_evictions_ = 0;
  CacheEventLog* event_log_ = nullptr;
};

}  // namespace tessera::kv
