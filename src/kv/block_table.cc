#include "kv/block_table.h"

#include <string>

#include "base/check.h"

namespace tessera::kv {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  TESSERA_CHECK_GT(block_size, 0);
}

BlockTable::~BlockTable() {
  TESSERA_CHECK(blocks_.empty()) << blocks_.size() << " KV blocks leaked by a BlockTable";
}

void BlockTable::set_partition(int32_t partition) {
  TESSERA_CHECK(blocks_.empty()) << "binding a table that holds " << blocks_.size() << " blocks";
  TESSERA_CHECK_GE(partition, -1);
  partition_ = partition;
}

Status BlockTable::Reserve(BlockAllocator& allocator, int64_t num_tokens) {
  TESSERA_CHECK_GE(num_tokens, 0);
  const int64_t needed = BlocksForTokens(num_tokens, block_size_);
  const int64_t have = static_cast<int64_t>(blocks_.size());
  if (needed <= have) return Status::Ok();
  const int32_t per_partition = allocator.num_blocks() / allocator.num_partitions();
  if (partition_ >= 0) {
    // Every new block from the table's partition (its DP rank's cache).
    const int32_t free = allocator.num_free_blocks(partition_);
    if (needed - have > free) {
      return ResourceExhaustedError(
          "KV cache full: " + std::to_string(num_tokens) + " tokens need " +
          std::to_string(needed - have) + " more blocks of " + std::to_string(block_size_) +
          " tokens on partition (DP rank) " + std::to_string(partition_) + ", only " +
          std::to_string(free) + " of its " + std::to_string(per_partition) + " are free");
    }
  } else if (needed - have > allocator.num_free_blocks()) {
    return ResourceExhaustedError("KV cache full: " + std::to_string(num_tokens) + " tokens need " +
                                  std::to_string(needed - have) + " more blocks of " +
                                  std::to_string(block_size_) + " tokens, only " +
                                  std::to_string(allocator.num_free_blocks()) + " of " +
                                  std::to_string(allocator.num_blocks()) + " are free");
  } else if (allocator.num_partitions() > 1) {
    // Each new index from its partition: every partition must have its share.
    std::vector<int64_t> wanted(static_cast<size_t>(allocator.num_partitions()), 0);
    for (int64_t j = have; j < needed; ++j)
      ++wanted[static_cast<size_t>(allocator.PartitionOfIndex(j))];
    for (int32_t p = 0; p < allocator.num_partitions(); ++p) {
      if (wanted[static_cast<size_t>(p)] > allocator.num_free_blocks(p)) {
        return ResourceExhaustedError(
            "KV cache full: " + std::to_string(num_tokens) + " tokens need " +
            std::to_string(wanted[static_cast<size_t>(p)]) + " more blocks of " +
            std::to_string(block_size_) + " tokens on partition (cp rank) " + std::to_string(p) +
            ", only " + std::to_string(allocator.num_free_blocks(p)) + " of its " +
            std::to_string(per_partition) + " are free");
      }
    }
  }
  while (static_cast<int64_t>(blocks_.size()) < needed) {
    const int64_t index = static_cast<int64_t>(blocks_.size());
    std::optional<BlockId> block =
        allocator.Allocate(partition_ >= 0 ? partition_ : allocator.PartitionOfIndex(index));
    TESSERA_CHECK(block.has_value());
    blocks_.push_back(*block);
  }
  return Status::Ok();
}

void BlockTable::AppendShared(BlockAllocator& allocator, BlockId block) {
  CheckPartition(allocator, block);
  allocator.AddRef(block);
  blocks_.push_back(block);
}

void BlockTable::AppendCached(BlockAllocator& allocator, BlockId block) {
  CheckPartition(allocator, block);
  allocator.Acquire(block);
  blocks_.push_back(block);
}

void BlockTable::CheckPartition(const BlockAllocator& allocator, BlockId block) const {
  TESSERA_CHECK(partition_ < 0 || allocator.PartitionOfId(block) == partition_)
      << "block " << block << " of partition " << allocator.PartitionOfId(block)
      << " appended to a table bound to partition " << partition_;
}

void BlockTable::Truncate(BlockAllocator& allocator, int64_t num_tokens) {
  TESSERA_CHECK_GE(num_tokens, 0);
  const int64_t keep = BlocksForTokens(num_tokens, block_size_);
  while (static_cast<int64_t>(blocks_.size()) > keep) {
    allocator.Release(blocks_.back());
    blocks_.pop_back();
  }
}

int64_t BlockTable::SlotOf(int64_t position) const {
  TESSERA_CHECK(position >= 0 && position < capacity_tokens())
      << "position " << position << " outside the " << capacity_tokens() << " reserved tokens";
  return static_cast<int64_t>(blocks_[static_cast<size_t>(position / block_size_)]) * block_size_ +
         position % block_size_;
}

bool BlockTable::IsBlockExclusive(const BlockAllocator& allocator, int64_t position) const {
  TESSERA_CHECK(position >= 0 && position < capacity_tokens());
  return allocator.RefCount(blocks_[static_cast<size_t>(position / block_size_)]) == 1;
}

}  // namespace tessera::kv
