#include "kv/block_allocator.h"

#include "base/check.h"

namespace tessera::kv {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  TESSERA_CHECK_GE(num_blocks, 0);
  ref_counts_.assign(static_cast<size_t>(num_blocks), 0);
  free_list_.reserve(static_cast<size_t>(num_blocks));
  for (BlockId block = num_blocks - 1; block >= 0; --block) free_list_.push_back(block);
}

std::optional<BlockId> BlockAllocator::Allocate() {
  if (free_list_.empty()) return std::nullopt;
  BlockId block = free_list_.back();
  free_list_.pop_back();
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
  if (--count == 0) free_list_.push_back(block);
}

int32_t BlockAllocator::RefCount(BlockId block) const {
  TESSERA_CHECK(block >= 0 && block < num_blocks()) << "block " << block;
  return ref_counts_[static_cast<size_t>(block)];
}

}  // namespace tessera::kv
