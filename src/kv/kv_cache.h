// KvCache: the storage behind the paged KV cache — num_blocks physical blocks, each
// every layer's K and V of block_size tokens ([num_layers, 2 (K, V), num_kv_heads,
// block_size, head_dim] elements, f32 or f16), a token addressed by flat slot =
// block * block_size + row. A layer's K (or V) pool is the view kernels/attention.h
// reads: its blocks BytesPerBlock() apart (KvCacheShape::layout()). A block is one
// contiguous range (one populate per block; one copy for a KV transfer), and the
// cache lies on transparent huge pages where the kernel has them: a decode step
// reads each head's rows of every block, one TLB entry per 2 MiB instead of per
// 4 KiB (110M Q8_0 at 2048 positions of context: decode 1.3–1.5× as fast on one
// thread). Layer: kv; the engine sizes it from a byte budget, the model writes new
// K/V rows with Store* and paged attention reads the pools through a block table.
// Not thread-safe for writers to the same slot; different slots may be written
// concurrently.
//
// Under tensor parallelism a rank's cache holds its own KV heads only, under
// pipeline parallelism its own layers only: the shape says what this rank stores.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "kernels/attention.h"

namespace tessera::kv {

struct KvCacheShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // tokens per block
  kernels::KvType type = kernels::KvType::kF32;

  int64_t row_elems() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
  int64_t elem_bytes() const { return type == kernels::KvType::kF16 ? 2 : 4; }
  // The per-layer pool layout paged attention reads (kernels/attention.h): blocks
  // hold every layer, so a pool's blocks are a whole block apart.
  kernels::KvLayout layout() const {
    return {.block_size = block_size,
            .n_kv_heads = num_kv_heads,
            .head_dim = head_dim,
            .type = type,
            .block_stride = BytesPerBlock() / elem_bytes()};
  }
  // Bytes of one block of K plus one of V, in every layer.
  int64_t BytesPerBlock() const;
  // Bytes to cache one token in every layer (K and V).
  int64_t BytesPerToken() const { return BytesPerBlock() / block_size; }
};

// Checks the shape (positive sizes).
Status ValidateKvCacheShape(const KvCacheShape& shape);

// Blocks that fit in `budget_bytes` (at least 0).
int32_t NumBlocksForBudget(const KvCacheShape& shape, int64_t budget_bytes);

// Under tensor or pipeline parallelism, where one rank's block sits in the block
// of a cache holding the whole model (`whole`): its layers from layer_begin and
// its KV heads from kv_head_begin, each [shape.num_kv_heads, block_size, head_dim]
// run of a (layer, K or V) contiguous in both. A KV transfer between instances of
// different layouts travels in the whole model's block (docs/pd.md).
struct KvShardSlice {
  KvCacheShape shape;  // the rank's cache shape
  int32_t layer_begin = 0;
  int32_t kv_head_begin = 0;
};

// InvalidArgument unless the slice lies inside `whole` with its dtype and block size.
Status CheckShardSlice(const KvCacheShape& whole, const KvShardSlice& slice);
// One block: the rank's bytes (slice.shape.BytesPerBlock()) into their place in the
// whole block, and back. The slice must pass CheckShardSlice.
void ShardBlockToWhole(const KvCacheShape& whole, const KvShardSlice& slice,
                       const uint8_t* shard_block, uint8_t* whole_block);
void WholeBlockToShard(const KvCacheShape& whole, const KvShardSlice& slice,
                       const uint8_t* whole_block, uint8_t* shard_block);

class KvCache {
 public:
  // Reserves num_blocks blocks (memory is committed by the OS as slots are first
  // written). InvalidArgument for a bad shape, ResourceExhausted if too large.
  static Result<KvCache> Create(const KvCacheShape& shape, int32_t num_blocks);

  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Writes one token's K and V rows ([num_kv_heads * head_dim] f32 each) of layer
  // `layer_idx` into `slot`, converting to the cache's type.
  void Store(int32_t layer_idx, int64_t slot, std::span<const float> k, std::span<const float> v);
  // Maps now the pages of the blocks that will hold positions [start, start + count)
  // of the sequence whose blocks are `block_table` (every layer), unless done
  // before for that block. The cache's memory is committed lazily (a cache sized
  // for the model's whole context costs what is used, rounded up to a huge page),
  // so each block's first writes would otherwise fault page by page in the middle
  // of a layer (~12 µs a fault on a VM, with the step's other threads waiting); one
  // madvise maps a block for a fraction of that (base/populate.h). Contents
  // unchanged.
  void PrepareWrite(std::span<const int32_t> block_table, int64_t start, int64_t count);
  // Reads one slot back as f32 (tests, KV transfer, debugging).
  void Load(int32_t layer_idx, int64_t slot, std::span<float> k, std::span<float> v) const;

  // Raw pools of one layer: block b at b · shape().BytesPerBlock() bytes, each
  // [num_kv_heads, block_size, head_dim] elements (shape().layout()).
  void* k_pool(int32_t layer_idx) { return PoolPtr(layer_idx, 0); }
  void* v_pool(int32_t layer_idx) { return PoolPtr(layer_idx, 1); }
  const void* k_pool(int32_t layer_idx) const { return PoolPtr(layer_idx, 0); }
  const void* v_pool(int32_t layer_idx) const { return PoolPtr(layer_idx, 1); }

  // Block `block`'s bytes (every layer's K and V, shape().BytesPerBlock() of them):
  // one contiguous range, what a KV transfer sends and receives.
  uint8_t* block_data(int32_t block) {
    return data_.data() + static_cast<int64_t>(block) * shape_.BytesPerBlock();
  }

  const KvCacheShape& shape() const { return shape_; }
  int32_t num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return static_cast<int64_t>(num_blocks_) * shape_.block_size; }
  int64_t size_bytes() const { return shape_.BytesPerBlock() * num_blocks_; }

 private:
  KvCache(const KvCacheShape& shape, int32_t num_blocks, HugePageBuffer data);
  uint8_t* PoolPtr(int32_t layer_idx, int kv) const;
  int64_t block_pool_bytes() const {  // one block of one pool
    return shape_.block_size * shape_.row_elems() * shape_.elem_bytes();
  }

  KvCacheShape shape_;
  int32_t num_blocks_ = 0;
  // [num_blocks, num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]
  HugePageBuffer data_;
  std::vector<bool> prepared_;  // per block: PrepareWrite mapped its pages
};

}  // namespace tessera::kv
