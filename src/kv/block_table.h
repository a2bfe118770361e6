// BlockTable: one sequence's list of KV-cache blocks, in token order — token at
// position p lives in blocks()[p / block_size] at row p % block_size. Layer: kv;
// the engine's Sequence owns one, the scheduler grows and frees it, the model
// runner hands blocks() to paged attention. Not thread-safe.
//
// Blocks may be shared with other tables (prefix caching, forks): the rule is that
// only a block whose refcount is 1 is ever written, so sharing is limited to full
// blocks of an identical prefix (checked by the engine with IsBlockExclusive).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/block_allocator.h"

namespace tessera::kv {

class BlockTable {
 public:
  explicit BlockTable(int32_t block_size);

  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  BlockTable(BlockTable&&) = default;
  BlockTable& operator=(BlockTable&&) = default;
  // Every block must have been given back (Release) before destruction.
  ~BlockTable();

  // Binds the table to one partition of a partitioned pool (data-parallel
  // attention: the DP rank whose cache holds the whole sequence): Reserve then
  // takes every new block from it. -1: each index from its placement's partition
  // (BlockAllocator::PartitionOfIndex), as unbound. Only while the table is empty.
  void set_partition(int32_t partition);
  int32_t partition() const { return partition_; }

  // Makes room for `num_tokens` tokens in total, allocating blocks as needed.
  // All or nothing: on ResourceExhausted the table is unchanged.
  Status Reserve(BlockAllocator& allocator, int64_t num_tokens);
  // Appends a block that is already allocated (e.g. a cached prefix block);
  // takes a reference on it. A bound table's blocks must be of its partition.
  void AppendShared(BlockAllocator& allocator, BlockId block);
  // Appends a block of the prefix cache (BlockAllocator::Lookup's, possibly with
  // no owner yet); takes a reference on it.
  void AppendCached(BlockAllocator& allocator, BlockId block);
  // Keeps only the blocks needed for `num_tokens` tokens; releases the rest.
  void Truncate(BlockAllocator& allocator, int64_t num_tokens);
  // Releases every block.
  void Release(BlockAllocator& allocator) { Truncate(allocator, 0); }

  // Flat slot index of the token at `position` in a pool of
  // [num_blocks * block_size] rows: block * block_size + position % block_size.
  int64_t SlotOf(int64_t position) const;
  // True when the block holding `position` is owned by this table alone.
  bool IsBlockExclusive(const BlockAllocator& allocator, int64_t position) const;

  std::span<const BlockId> blocks() const { return blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t capacity_tokens() const { return static_cast<int64_t>(blocks_.size()) * block_size_; }

 private:
  void CheckPartition(const BlockAllocator& allocator, BlockId block) const;

  int32_t block_size_;
  int32_t partition_ = -1;  // -1: by index
  std::vector<BlockId> blocks_;
};

// Blocks needed to hold `num_tokens` tokens.
inline int64_t BlocksForTokens(int64_t num_tokens, int32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace tessera::kv
