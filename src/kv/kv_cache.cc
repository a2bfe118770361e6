#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "base/check.h"
#include "base/populate.h"
#include "kernels/quantize.h"

namespace tessera::kv {

using kernels::KvType;
using kernels::WeightType;

int64_t KvCacheShape::BytesPerBlock() const {
  return int64_t{2} * num_layers * block_size * row_elems() * elem_bytes();
}

Status ValidateKvCacheShape(const KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0) {
    return InvalidArgumentError(
        "KV cache shape must be positive: layers " + std::to_string(shape.num_layers) +
        ", kv heads " + std::to_string(shape.num_kv_heads) + ", head_dim " +
        std::to_string(shape.head_dim) + ", block size " + std::to_string(shape.block_size));
  }
  return Status::Ok();
}

Status CheckShardSlice(const KvCacheShape& whole, const KvShardSlice& slice) {
  const KvCacheShape& part = slice.shape;
  if (part.type != whole.type || part.block_size != whole.block_size ||
      part.head_dim != whole.head_dim || slice.layer_begin < 0 || slice.kv_head_begin < 0 ||
      part.num_layers < 1 || part.num_kv_heads < 1 ||
      slice.layer_begin + part.num_layers > whole.num_layers ||
      slice.kv_head_begin + part.num_kv_heads > whole.num_kv_heads) {
    return InvalidArgumentError(
        "a KV shard of layers " + std::to_string(slice.layer_begin) + "+" +
        std::to_string(part.num_layers) + " and KV heads " + std::to_string(slice.kv_head_begin) +
        "+" + std::to_string(part.num_kv_heads) + " (head dim " + std::to_string(part.head_dim) +
        ", block " + std::to_string(part.block_size) + ") does not fit a cache of " +
        std::to_string(whole.num_layers) + " layers and " + std::to_string(whole.num_kv_heads) +
        " KV heads (head dim " + std::to_string(whole.head_dim) + ", block " +
        std::to_string(whole.block_size) + ") of the same dtype");
  }
  return Status::Ok();
}

namespace {

// Calls copy(shard offset, whole offset, bytes) for each (layer, K or V) run of the slice.
template <typename Copy>
void ForEachShardRun(const KvCacheShape& whole, const KvShardSlice& slice, Copy copy) {
  const KvCacheShape& part = slice.shape;
  const int64_t head_bytes = int64_t{part.block_size} * part.head_dim * part.elem_bytes();
  const int64_t run = part.num_kv_heads * head_bytes;
  for (int32_t l = 0; l < part.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const int64_t whole_run = (int64_t{slice.layer_begin + l} * 2 + kv) * whole.num_kv_heads;
      copy((int64_t{l} * 2 + kv) * run, (whole_run + slice.kv_head_begin) * head_bytes, run);
    }
  }
}

}  // namespace

void ShardBlockToWhole(const KvCacheShape& whole, const KvShardSlice& slice,
                       const uint8_t* shard_block, uint8_t* whole_block) {
  ForEachShardRun(whole, slice, [&](int64_t at_shard, int64_t at_whole, int64_t bytes) {
    std::memcpy(whole_block + at_whole, shard_block + at_shard, static_cast<size_t>(bytes));
  });
}

void WholeBlockToShard(const KvCacheShape& whole, const KvShardSlice& slice,
                       const uint8_t* whole_block, uint8_t* shard_block) {
  ForEachShardRun(whole, slice, [&](int64_t at_shard, int64_t at_whole, int64_t bytes) {
    std::memcpy(shard_block + at_shard, whole_block + at_whole, static_cast<size_t>(bytes));
  });
}

int32_t NumBlocksForBudget(const KvCacheShape& shape, int64_t budget_bytes) {
  const int64_t per_block = shape.BytesPerBlock();
  TESSERA_CHECK_GT(per_block, 0);
  if (budget_bytes <= 0) return 0;
  const int64_t blocks = budget_bytes / per_block;
  return static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max()));
}

Result<KvCache> KvCache::Create(const KvCacheShape& shape, int32_t num_blocks) {
  TESSERA_RETURN_IF_ERROR(ValidateKvCacheShape(shape));
  if (num_blocks < 0) return InvalidArgumentError("negative KV block count");
  const uint64_t per_block = static_cast<uint64_t>(shape.BytesPerBlock());
  const uint64_t bytes = per_block * static_cast<uint64_t>(num_blocks);
  if (bytes / per_block != static_cast<uint64_t>(num_blocks) || bytes > (uint64_t{1} << 48)) {
    return ResourceExhaustedError("KV cache of " + std::to_string(num_blocks) + " blocks of " +
                                  std::to_string(per_block) + " bytes is too large");
  }
  // Untouched pages cost no memory (PrepareWrite maps blocks as they are first
  // written).
  Result<HugePageBuffer> data = HugePageBuffer::Map(static_cast<size_t>(bytes));
  if (!data.ok()) {
    return ResourceExhaustedError("cannot allocate a KV cache of " + std::to_string(bytes) +
                                  " bytes: " + data.status().message());
  }
  return KvCache(shape, num_blocks, std::move(data).value());
}

KvCache::KvCache(const KvCacheShape& shape, int32_t num_blocks, HugePageBuffer data)
    : shape_(shape),
      num_blocks_(num_blocks),
      data_(std::move(data)),
      prepared_(static_cast<size_t>(num_blocks), false) {}

uint8_t* KvCache::PoolPtr(int32_t layer_idx, int kv) const {
  TESSERA_CHECK(layer_idx >= 0 && layer_idx < shape_.num_layers) << "layer " << layer_idx;
  return const_cast<uint8_t*>(data_.data()) +
         (static_cast<int64_t>(layer_idx) * 2 + kv) * block_pool_bytes();
}

void KvCache::Store(int32_t layer_idx, int64_t slot, std::span<const float> k,
                    std::span<const float> v) {
  const int64_t n = shape_.row_elems();
  TESSERA_CHECK(slot >= 0 && slot < num_slots()) << "slot " << slot;
  TESSERA_CHECK_EQ(static_cast<int64_t>(k.size()), n);
  TESSERA_CHECK_EQ(static_cast<int64_t>(v.size()), n);
  // The model's own store (one table entry: this slot's block).
  const int32_t block = static_cast<int32_t>(slot / shape_.block_size);
  kernels::StoreKv(shape_.layout(), {&block, 1}, slot % shape_.block_size, k.data(), v.data(),
                   PoolPtr(layer_idx, 0), PoolPtr(layer_idx, 1));
}

void KvCache::PrepareWrite(std::span<const int32_t> block_table, int64_t start, int64_t count) {
  if (count <= 0 || start < 0) return;
  const int64_t first = start / shape_.block_size;
  const int64_t last = std::min<int64_t>((start + count - 1) / shape_.block_size,
                                         static_cast<int64_t>(block_table.size()) - 1);
  for (int64_t i = first; i <= last; ++i) {
    const int32_t block = block_table[static_cast<size_t>(i)];
    if (block < 0 || block >= num_blocks_ || prepared_[static_cast<size_t>(block)]) continue;
    prepared_[static_cast<size_t>(block)] = true;
    const int64_t block_bytes = shape_.BytesPerBlock();  // every layer's K and V
    PopulateForWrite(PoolPtr(0, 0) + block * block_bytes, static_cast<size_t>(block_bytes));
  }
}

void KvCache::Load(int32_t layer_idx, int64_t slot, std::span<float> k, std::span<float> v) const {
  const int64_t n = shape_.row_elems();
  TESSERA_CHECK(slot >= 0 && slot < num_slots()) << "slot " << slot;
  TESSERA_CHECK_EQ(static_cast<int64_t>(k.size()), n);
  TESSERA_CHECK_EQ(static_cast<int64_t>(v.size()), n);
  const WeightType type = shape_.type == KvType::kF16 ? WeightType::kF16 : WeightType::kF32;
  const kernels::KvLayout layout = shape_.layout();
  const int64_t d = shape_.head_dim;
  for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
    const int64_t offset =
        layout.RowIndex(slot / shape_.block_size, slot % shape_.block_size, h) * layout.ElemBytes();
    kernels::DequantizeRow(type, PoolPtr(layer_idx, 0) + offset, d, k.data() + h * d);
    kernels::DequantizeRow(type, PoolPtr(layer_idx, 1) + offset, d, v.data() + h * d);
  }
}

}  // namespace tessera::kv
