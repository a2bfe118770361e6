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
//
// Spans: a query's positions are taken in spans of KvLayout::span positions ([0, S),
// [S, 2S), …). Each span's softmax is computed on its own (its max, its sum of
// exponentials, its exp-weighted sum of V rows from zero, in position order), and the
// spans are folded in ascending order by FoldAttentionSpan; the result is divided by
// the folded sum last. A span's partial depends only on that span's K/V rows and the
// query, so a context-parallel rank holding some spans computes exactly the partials
// one rank would, and folding everyone's partials in span order gives one rank's bits.
// A context of at most S positions is one span: a plain softmax.
#pragma once

#include <cstdint>
#include <span>

namespace tessera {
class ThreadPool;
}

namespace tessera::kernels {

enum class KvType { kF32, kF16 };

// Positions per softmax span (see "Spans" above): the unit a context-parallel split
// of a sequence is made of.
inline constexpr int64_t kAttentionSpan = 256;

struct KvLayout {
  int64_t block_size = 16;  // tokens per block
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  KvType type = KvType::kF32;
  int64_t block_stride = 0;       // elements from a block to the next; 0 = BlockElems()
  int64_t span = kAttentionSpan;  // positions per softmax span (tests use short ones)

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

// One query's per-span partials, spans [first_span, first_span + n_spans): for span k
// and query head hq, its max and sum of exp(score - max) at [(k - first_span) ·
// n_heads + hq] of max and sum, its exp-weighted sum of V rows (not divided) at
// Out(k, hq). Arrays borrowed: n_spans · n_heads floats (max, sum), times head_dim
// (out).
struct SpanPartials {
  int64_t first_span = 0;
  int64_t n_spans = 0;
  int64_t n_heads = 0;
  float* out = nullptr;
  float* max = nullptr;
  float* sum = nullptr;

  float* Out(int64_t k, int64_t hq, int64_t head_dim) const {
    return out + ((k - first_span) * n_heads + hq) * head_dim;
  }
  void Set(int64_t k, int64_t hq, float span_max, float span_sum) const {
    max[(k - first_span) * n_heads + hq] = span_max;
    sum[(k - first_span) * n_heads + hq] = span_sum;
  }
};

// Folds one span's partial (its max, its sum of exp(score - max), its exp-weighted sum
// of V rows span_out[0, n)) into a running one (max, sum, out[0, n)), rescaling both
// to the larger max. Compiled once, for every target, so that the kernel's own fold
// and a context-parallel merge of partials from other ranks give the same bits.
void FoldAttentionSpan(float& max, float& sum, float* out, float span_max, float span_sum,
                       const float* span_out, int64_t n);

// Writes one token's k and v ([n_kv_heads, head_dim] f32 each) at logical position
// pos of the sequence whose table is block_table, converting to the pool's type.
void StoreKv(const KvLayout& layout, std::span<const int32_t> block_table, int64_t pos,
             const float* k, const float* v, void* k_pool, void* v_pool);

// One head's row as StoreKv writes it into an f16 pool: `n` values converted by
// F32ToF16Row, so rows converted here elsewhere and stored by StoreKvF16 are the
// bits StoreKv would store.
void KvHeadToF16(const float* in, uint16_t* out, int64_t n);
// StoreKv into an f16 pool (layout.type kF16) of a token whose k and v are already
// f16 ([n_kv_heads, head_dim] each, every head converted by KvHeadToF16).
void StoreKvF16(const KvLayout& layout, std::span<const int32_t> block_table, int64_t pos,
                const uint16_t* k, const uint16_t* v, void* k_pool, void* v_pool);

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

// The partials of spans [first_span, first_span + n_spans) of one query at position
// pos (the last may be partly past pos: it is cut there) — exactly what Attention
// computes for those spans, reading only their K/V (a context-parallel rank's share;
// block-table entries of other positions are not read).
void AttentionSpanPartials(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
                           int64_t n_heads, int64_t pos, const SpanPartials& partials,
                           ThreadPool* pool = nullptr);

// out [n_heads, head_dim] = the fold of partials.first_span = 0 .. n_spans − 1 in
// ascending order, divided by the folded sum: with every span of a query's context,
// Attention's bits.
void FoldAttentionPartials(const SpanPartials& partials, int64_t n_heads, int64_t head_dim,
                           float* out);

}  // namespace tessera::kernels
