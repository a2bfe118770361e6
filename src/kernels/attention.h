// Attention over a paged KV cache (one layer), and the store of new K/V into it.
// Layer: kernels; called by model/ (forward pass) with pools owned by kv/ and block
// tables from the engine. Pure functions of their inputs; thread-safe for disjoint
// outputs (StoreKv writes only the slots of the positions it is given).
//
// Layout contract (what kv/ allocates and engine/ fills):
//   A layer's K pool is n_blocks physical blocks, block_stride elements apart
//   (BlockStride(): BlockElems() unless set — kv/ interleaves every layer's K and V
//   blocks of a physical block), each [n_kv_heads, block_size tokens, head_dim]
//   contiguous (head-major: one head's rows of a block are one run of block_size ·
//   head_dim elements, so a head's scan reads whole runs rather than one row in
//   every n_kv_heads), element type f32 or f16 (IEEE half, round to nearest even on
//   store); the V pool has the same shape. Element (block b, slot s, head h, dim d)
//   is at index b * BlockStride() + (h * block_size + s) * head_dim + d
//   (KvLayout::RowIndex).
//   A sequence's block table maps logical block i (positions [i*block_size,
//   (i+1)*block_size)) to physical block block_table[i]. Position p therefore lives
//   in block block_table[p / block_size], slot p % block_size.
// Attention for a query at position p reads positions [0, p] (causal; K/V for p must
// already be stored), uses grouped-query heads (query head h reads KV head
// h / (n_heads / n_kv_heads)) and scale 1/sqrt(head_dim), and writes [n_heads,
// head_dim]. A query's result depends only on its q, its position and the cache
// contents — never on the other queries processed with it (AttentionMulti gives the
// same bits as Attention per query) nor on the thread count.
#pragma once

#include <cstdint>
#include <span>

namespace tessera {
class ThreadPool;
}

namespace tessera::kernels {

enum class KvType { kF32, kF16 };

struct KvLayout {
  int64_t block_size = 16;  // tokens per block
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  KvType type = KvType::kF32;
  int64_t block_stride = 0;  // elements from a block to the next; 0 = BlockElems()

  int64_t ElemBytes() const { return type == KvType::kF32 ? 4 : 2; }
  int64_t TokenElems() const { return n_kv_heads * head_dim; }
  int64_t BlockElems() const { return block_size * TokenElems(); }
  int64_t BlockBytes() const { return BlockElems() * ElemBytes(); }
  int64_t BlockStride() const { return block_stride > 0 ? block_stride : BlockElems(); }
  // Index of element 0 of head h's row at slot s of physical block b.
  int64_t RowIndex(int64_t b, int64_t s, int64_t h) const {
    return b * BlockStride() + (h * block_size + s) * head_dim;
  }
};

// One layer's K and V pools (borrowed).
struct PagedKv {
  KvLayout layout;
  const void* k = nullptr;  // n_blocks of [n_kv_heads, block_size, head_dim], BlockStride() apart
  const void* v = nullptr;  // same shape
  int64_t n_blocks = 0;     // physical blocks in each pool (for bounds checks)
};

// Writes one token's k and v ([n_kv_heads, head_dim] f32 each) at logical position
// pos of the sequence whose table is block_table, converting to the pool's type.
void StoreKv(const KvLayout& layout, std::span<const int32_t> block_table, int64_t pos,
             const float* k, const float* v, void* k_pool, void* v_pool);

// One query token at position pos: q [n_heads, head_dim] -> out [n_heads, head_dim].
// pool may be null; with a pool, KV-head groups run in parallel.
void Attention(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
               int64_t n_heads, int64_t pos, float* out, ThreadPool* pool = nullptr);

// n_queries consecutive query tokens of one sequence at positions pos0 ..
// pos0 + n_queries - 1 (prefill), sharing each K/V row load among them:
// q [n_queries, n_heads, head_dim] -> out [n_queries, n_heads, head_dim].
// Bit-identical to calling Attention for each query.
void AttentionMulti(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
                    int64_t n_heads, int64_t pos0, int64_t n_queries, float* out,
                    ThreadPool* pool = nullptr);

}  // namespace tessera::kernels
