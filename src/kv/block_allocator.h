// BlockAllocator: hands out fixed-size KV-cache blocks by id, with a reference
// count per block so that several sequences can share one (prefix caching, forked
// sequences, KV transfer). Layer: kv; the engine's scheduler and BlockTable call it.
// Not thread-safe: one scheduler thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tessera::kv {

using BlockId = int32_t;

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;
  BlockAllocator(BlockAllocator&&) = default;
  BlockAllocator& operator=(BlockAllocator&&) = default;

  // A free block with reference count 1, or nullopt when every block is in use.
  // Blocks are handed out lowest id first after construction, then most recently
  // freed first (warm in cache).
  std::optional<BlockId> Allocate();
  // Another owner of an allocated block (refcount + 1).
  void AddRef(BlockId block);
  // Drops one reference; the block is free again when the count reaches 0.
  void Release(BlockId block);

  int32_t RefCount(BlockId block) const;
  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_used_blocks() const { return num_blocks() - num_free_blocks(); }

 private:
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<BlockId> free_list_;   // stack; back() is handed out next
};

}  // namespace tessera::kv
