#include "kv/block_allocator.h"

#include <algorithm>

#include "base/check.h"

namespace tessera::kv {

BlockAllocator::BlockAllocator(int32_t num_blocks) : BlockAllocator(num_blocks, 1, {}) {}

BlockAllocator::BlockAllocator(int32_t num_blocks, int32_t partitions, BlockPlacement placement)
    : placement_(std::move(placement)) {
  TESSERA_CHECK_GE(num_blocks, 0);
  TESSERA_CHECK(partitions >= 1 && num_blocks % partitions == 0)
      << partitions << " partitions of " << num_blocks << " blocks";
  ref_counts_.assign(static_cast<size_t>(num_blocks), 0);
  entries_.resize(static_cast<size_t>(num_blocks));
  free_lists_.resize(static_cast<size_t>(partitions));
  const int32_t per = num_blocks / partitions;
  for (int32_t p = 0; p < partitions; ++p) {
    std::vector<BlockId>& list = free_lists_[static_cast<size_t>(p)];
    list.reserve(static_cast<size_t>(per));
    for (BlockId block = (p + 1) * per - 1; block >= p * per; --block) list.push_back(block);
  }
  num_free_ = num_blocks;
}

int32_t BlockAllocator::num_free_blocks(int32_t partition) const {
  TESSERA_CHECK(partition >= 0 && partition < num_partitions()) << "partition " << partition;
  int32_t n = static_cast<int32_t>(free_lists_[static_cast<size_t>(partition)].size());
  if (num_partitions() == 1) return n + static_cast<int32_t>(evictable_.size());
  for (BlockId block : evictable_) n += PartitionOfId(block) == partition ? 1 : 0;
  return n;
}

std::optional<BlockId> BlockAllocator::Allocate(int32_t partition) {
  TESSERA_CHECK(partition >= 0 && partition < num_partitions()) << "partition " << partition;
  std::vector<BlockId>& free_list = free_lists_[static_cast<size_t>(partition)];
  BlockId block;
  if (!free_list.empty()) {
    block = free_list.back();
    free_list.pop_back();
    --num_free_;
  } else {
    // The least recently used cached block of this partition (the front one alone).
    auto victim = evictable_.begin();
    while (victim != evictable_.end() && PartitionOfId(*victim) != partition) ++victim;
    if (victim == evictable_.end()) return std::nullopt;
    block = *victim;
    evictable_.erase(victim);
    Unregister(block);
    ++num_evictions_;
  }
  TESSERA_CHECK_EQ(ref_counts_[static_cast<size_t>(block)], 0);
  ref_counts_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockAllocator::AddRef(BlockId block) {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  int32_t& count = ref_counts_[static_cast<size_t>(block)];
  TESSERA_CHECK_GT(count, 0) << "AddRef on free block " << block;
  ++count;
}

void BlockAllocator::Release(BlockId block) {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  int32_t& count = ref_counts_[static_cast<size_t>(block)];
  TESSERA_CHECK_GT(count, 0) << "Release of free block " << block;
  if (--count > 0) return;
  CacheEntry& entry = entries_[static_cast<size_t>(block)];
  if (entry.registered) {
    entry.lru_pos = evictable_.insert(evictable_.end(), block);
  } else {
    free_lists_[static_cast<size_t>(PartitionOfId(block))].push_back(block);
    ++num_free_;
  }
}

bool BlockAllocator::Register(BlockId block, const BlockHash& parent, const BlockHash& hash,
                              std::span<const int32_t> tokens) {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  TESSERA_CHECK_GT(ref_counts_[static_cast<size_t>(block)], 0)
      << "Register of free block " << block;
  CacheEntry& entry = entries_[static_cast<size_t>(block)];
  if (entry.registered || by_hash_.contains(hash)) return false;
  entry.registered = true;
  entry.parent = parent;
  entry.hash = hash;
  entry.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, block);
  if (event_log_ != nullptr) event_log_->Stored(hash);
  return true;
}

std::optional<BlockId> BlockAllocator::Lookup(const BlockHash& parent, const BlockHash& hash,
                                              std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const CacheEntry& entry = entries_[static_cast<size_t>(it->second)];
  if (!(entry.parent == parent) ||
      !std::equal(entry.tokens.begin(), entry.tokens.end(), tokens.begin(), tokens.end())) {
    return std::nullopt;  // a hash collision: not the same block
  }
  return it->second;
}

void BlockAllocator::Acquire(BlockId block) {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  CacheEntry& entry = entries_[static_cast<size_t>(block)];
  TESSERA_CHECK(entry.registered) << "Acquire of uncached block " << block;
  int32_t& count = ref_counts_[static_cast<size_t>(block)];
  if (count == 0) evictable_.erase(entry.lru_pos);
  ++count;
}

void BlockAllocator::Unregister(BlockId block) {
  CacheEntry& entry = entries_[static_cast<size_t>(block)];
  TESSERA_CHECK(entry.registered);
  by_hash_.erase(entry.hash);
  if (event_log_ != nullptr) event_log_->Removed(entry.hash);
  entry.registered = false;
  entry.tokens.clear();
}

void BlockAllocator::ClearCache() {
  for (BlockId block : evictable_) {
    Unregister(block);
    free_lists_[static_cast<size_t>(PartitionOfId(block))].push_back(block);
    ++num_free_;
  }
  evictable_.clear();
  for (BlockId block = 0; block < num_blocks(); ++block) {
    if (entries_[static_cast<size_t>(block)].registered) Unregister(block);
  }
}

int32_t BlockAllocator::RefCount(BlockId block) const {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  return ref_counts_[static_cast<size_t>(block)];
}

bool BlockAllocator::IsCached(BlockId block) const {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  return entries_[static_cast<size_t>(block)].registered;
}

}  // namespace tessera::kv
