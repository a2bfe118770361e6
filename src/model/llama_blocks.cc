#include "model/llama_blocks.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "parallel/context_shard.h"

namespace tessera::model {
namespace {

// Tile sizes (BlockTileTokens): the matmuls reach their per-token speed from ~256
// tokens (kernels_bench BM_MatMul*: at 64 tokens a 5632×2048 product takes 1.05×
// (Q8_0), 1.07× (Q4_0) and 1.13× (F16, which widens its weights once per call) the
// time per token it takes at 512; the K-quants ~1.0×).
constexpr int64_t kMinTileTokens = 64;
constexpr int64_t kMaxTileTokens = 512;
// Activations of one tile at most this fraction of the weights (a 110M Q8_0 model's
// pp512 would otherwise hold ~15 MiB of them, 10% of its weights and KV).
constexpr int64_t kTileBudgetFraction = 48;

}  // namespace

void AddBias(float* y, std::span<const float> bias, int64_t num_tokens) {
  if (bias.empty()) return;
  const size_t n = bias.size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::span<float> row(y + static_cast<size_t>(t) * n, n);
    kernels::Add(row, bias, row);
  }
}

int64_t BlockTileTokens(const ModelConfig& c, int64_t weight_bytes) {
  // Every buffer but x, per token: h, q, k, v, attn, proj and the FFN's gate and up.
  const int64_t floats_per_token = 2 * c.dim + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_dim;
  const int64_t budget = weight_bytes / kTileBudgetFraction;
  const int64_t fits = budget / std::max<int64_t>(1, floats_per_token * int64_t{sizeof(float)});
  int64_t tile = kMinTileTokens;
  while (tile * 2 <= std::min(fits, kMaxTileTokens)) tile *= 2;
  return tile;
}

void Linear(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  kernels::MatMul(w.view(), x, n, y, {.k_chunks = w.k_chunks}, &pool);
}

void LinearShared(std::initializer_list<std::pair<const WeightMatrix*, float*>> products,
                  const float* x, int64_t n, ThreadPool& pool) {
  kernels::SharedProduct shared[kernels::kMaxSharedProducts];
  TESSERA_CHECK_LE(products.size(), std::size(shared));
  size_t i = 0;
  for (const auto& [w, y] : products) shared[i++] = {w->view(), y, w->k_chunks};
  kernels::MatMulShared({shared, i}, x, n, &pool);
}

void NormRows(const float* x, std::span<const float> weight, float eps, int64_t num_tokens,
              int64_t dim, float* out, ThreadPool& pool) {
  const size_t d = static_cast<size_t>(dim);
  pool.ParallelFor(num_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::RmsNorm({x + t * dim, d}, weight, eps, {out + t * dim, d});
    }
  });
}

void AddInto(float* x, const float* y, int64_t n) {
  std::span<float> xs(x, static_cast<size_t>(n));
  kernels::Add(xs, {y, static_cast<size_t>(n)}, xs);
}

void SwiGluFfn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down,
               const float* x, int64_t n, std::vector<float>& gate_buf, std::vector<float>& up_buf,
               float* out, ThreadPool& pool) {
  const size_t elems = static_cast<size_t>(n * gate.rows);
  gate_buf.resize(elems);
  up_buf.resize(elems);
  LinearShared({{&gate, gate_buf.data()}, {&up, up_buf.data()}}, x, n, pool);
  kernels::SwiGlu(std::span<const float>(gate_buf.data(), elems),
                  std::span<const float>(up_buf.data(), elems),
                  std::span<float>(gate_buf.data(), elems));
  Linear(down, gate_buf.data(), n, out, pool);
}

Status ReduceRowParallel(std::span<float> partial, TensorParallelOps* tp,
                         const WeightMatrix* next) {
  return tp != nullptr ? tp->AllReduceSum(partial, next) : Status::Ok();
}

namespace {

// The segments of rows [t0, t1), sequence by sequence.
void SegmentsOfTile(std::span<const ForwardSequence> sequences, int64_t t0, int64_t t1,
                    std::vector<TileSegment>& out) {
  out.clear();
  int64_t row = 0;
  for (size_t i = 0; i < sequences.size() && row < t1; ++i) {
    const int64_t begin = std::max(row, t0), end = std::min(row + sequences[i].num_tokens, t1);
    if (begin < end)
      out.push_back({.sequence = i, .first = begin - row, .row = begin, .n = end - begin});
    row += sequences[i].num_tokens;
  }
}

}  // namespace

bool HoldsPosition(const kernels::KvLayout& layout, const ContextGroup& cp, int64_t pos) {
  return cp.size == 1 || parallel::ContextSpanOwner(pos / layout.span, cp.size) == cp.rank;
}

void ProjectQkvTile(const ModelConfig& c, const kernels::RopeParams& rope,
                    const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                    const KvLayerView& kv_layer, const ContextGroup& cp, int64_t t0, int64_t n,
                    const float* h, float* q, float* k, float* v, LlamaScratch& s,
                    ThreadPool& pool) {
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  LinearShared({{&w.wq, q}, {&w.wk, k}, {&w.wv, v}}, h, n, pool);
  AddBias(q, w.bq, n);
  AddBias(k, w.bk, n);
  AddBias(v, w.bv, n);

  // RoPE at each token's position, then append its K/V to its sequence's blocks.
  std::vector<TileSegment>& segments = s.tile_segments;
  SegmentsOfTile(batch.sequences, t0, t0 + n, segments);
  for (const TileSegment& seg : segments) {
    const ForwardSequence& seq = batch.sequences[seg.sequence];
    pool.ParallelFor(seg.n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = seg.row - t0 + i, pos = seq.start_position + seg.first + i;
        kernels::Rope(rope, pos, q + row * q_dim, c.num_heads, c.head_dim);
        kernels::Rope(rope, pos, k + row * kv_dim, c.num_kv_heads, c.head_dim);
        if (!HoldsPosition(kv.layout, cp, pos)) continue;
        kernels::StoreKv(kv.layout, seq.block_table, pos, k + row * kv_dim, v + row * kv_dim,
                         kv_layer.k, kv_layer.v);
      }
    });
  }
}

namespace {

// Rows [t0, t0 + n) of the step, their normalised input in h ([n, dim]): q/k/v
// (tile-sized) and the attention output `attn` of each token over its sequence's
// positions [0, pos] — under context parallelism over the KV spread across the
// group (ContextParallelAttention).
Status AttendNormedTile(const ModelConfig& c, const kernels::RopeParams& rope,
                        const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                        const KvLayerView& kv_layer, const ContextGroup& cp, int64_t t0, int64_t n,
                        const float* h, LlamaScratch& s, ThreadPool& pool) {
  const int64_t q_dim = c.q_dim();
  ProjectQkvTile(c, rope, w, batch, kv, kv_layer, cp, t0, n, h, s.q.data(), s.k.data(), s.v.data(),
                 s, pool);
  const std::vector<TileSegment>& segments = s.tile_segments;

  const kernels::PagedKv paged{
      .layout = kv.layout, .k = kv_layer.k, .v = kv_layer.v, .n_blocks = kv.num_blocks};
  if (cp.size > 1) {
    std::vector<ContextQuery>& queries = s.cp.queries;
    queries.clear();
    for (const TileSegment& seg : segments) {
      const ForwardSequence& seq = batch.sequences[seg.sequence];
      for (int64_t i = 0; i < seg.n; ++i) {
        const int64_t row = seg.row - t0 + i;
        queries.push_back({.block_table = seq.block_table,
                           .q = s.q.data() + row * q_dim,
                           .pos = seq.start_position + seg.first + i,
                           .out = s.attn.data() + row * q_dim});
      }
    }
    return ContextParallelAttention(
        paged, queries, c.num_heads, cp.rank, cp.size,
        [&cp](std::span<float> data, size_t block) {
          return cp.ops->ContextAllGatherBlocks(data, block);
        },
        s.cp.partials, &pool);
  }

  // Each token attends to its own sequence's positions [0, pos]; the earlier tiles'
  // tokens are in the cache already. One segment: the kernel spreads KV-head groups
  // over the pool; several: one per thread.
  auto attend = [&](size_t idx, ThreadPool* inner) {
    const TileSegment& seg = segments[idx];
    const ForwardSequence& seq = batch.sequences[seg.sequence];
    const int64_t row = seg.row - t0;
    kernels::AttentionMulti(paged, seq.block_table, s.q.data() + row * q_dim, c.num_heads,
                            seq.start_position + seg.first, seg.n, s.attn.data() + row * q_dim,
                            inner);
  };
  if (segments.size() == 1) {
    attend(0, &pool);
  } else {
    pool.ParallelFor(static_cast<int64_t>(segments.size()), [&](int64_t b, int64_t e) {
      for (int64_t idx = b; idx < e; ++idx) attend(static_cast<size_t>(idx), nullptr);
    });
  }
  return Status::Ok();
}

// AttendNormedTile with h = rmsnorm(x) of rows [t0, t0 + n).
Status AttendTile(const ModelConfig& c, const kernels::RopeParams& rope, const LlamaLayerWeights& w,
                  const ForwardBatch& batch, const KvView& kv, const KvLayerView& kv_layer,
                  const ContextGroup& cp, int64_t t0, int64_t n, LlamaScratch& s,
                  ThreadPool& pool) {
  NormRows(s.x.data() + t0 * c.dim, w.attn_norm, c.rms_eps, n, c.dim, s.h.data(), pool);
  return AttendNormedTile(c, rope, w, batch, kv, kv_layer, cp, t0, n, s.h.data(), s, pool);
}

// Sequence parallelism, one chunk: h = the chunk's rows normalised — this rank's
// piece of x normalised into its slot, then the pieces all-gathered (rank order is
// row order, so h's first n rows are the chunk's).
Status GatherNormedChunk(const ModelConfig& c, std::span<const float> norm,
                         const parallel::SequenceChunk& chunk, int tp_rank, int tp_size,
                         LlamaScratch& s, ThreadPool& pool, TensorParallelOps& tp) {
  const size_t block = static_cast<size_t>(chunk.piece * c.dim);
  s.h.resize(block * static_cast<size_t>(tp_size));
  NormRows(s.x.data() + chunk.shard_row * c.dim, norm, c.rms_eps, chunk.piece, c.dim,
           s.h.data() + static_cast<size_t>(tp_rank) * block, pool);
  return tp.AllGatherBlocks(std::span<float>(s.h.data(), s.h.size()), block);
}

// Sequence parallelism, one chunk: s.proj's first n rows hold the chunk's row-
// parallel partial sums; the padding rows are zeroed, the blocks reduce-scattered
// (this rank's piece summed over the group, as the all-reduce would) and added to
// x's piece with the bias, as the all-reduce path adds them to every row.
Status ScatterAddChunk(const ModelConfig& c, std::span<const float> bias,
                       const parallel::SequenceChunk& chunk, int tp_size, LlamaScratch& s,
                       TensorParallelOps& tp) {
  const size_t block = static_cast<size_t>(chunk.piece * c.dim);
  std::fill(s.proj.begin() + chunk.n * c.dim,
            s.proj.begin() + static_cast<ptrdiff_t>(block) * tp_size, 0.0f);
  s.sp_piece.resize(block);
  TESSERA_RETURN_IF_ERROR(tp.ReduceScatterSum(
      std::span<const float>(s.proj.data(), block * static_cast<size_t>(tp_size)), s.sp_piece));
  AddBias(s.sp_piece.data(), bias, chunk.piece);
  AddInto(s.x.data() + chunk.shard_row * c.dim, s.sp_piece.data(), chunk.piece * c.dim);
  return Status::Ok();
}

}  // namespace

Status AttentionBlock(const ModelConfig& c, const kernels::RopeParams& rope,
                      const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                      const KvLayerView& kv_layer, int64_t tile_tokens, LlamaScratch& s,
                      ThreadPool& pool, TensorParallelOps* tp, const ContextGroup& cp) {
  const int64_t num_tokens = static_cast<int64_t>(batch.tokens.size());
  const int64_t dim = c.dim;
  const int64_t tile = std::min(tile_tokens, num_tokens);
  s.h.resize(static_cast<size_t>(tile * dim));
  s.q.resize(static_cast<size_t>(tile * c.q_dim()));
  s.k.resize(static_cast<size_t>(tile * c.kv_dim()));
  s.v.resize(static_cast<size_t>(tile * c.kv_dim()));
  s.attn.resize(static_cast<size_t>(tile * c.q_dim()));
  // Under tensor parallelism the output projection is a partial sum that one
  // all-reduce completes for the whole step; alone, each tile adds its own rows.
  const bool whole_step = tp != nullptr;
  s.proj.resize(static_cast<size_t>((whole_step ? num_tokens : tile) * dim));
  for (int64_t t0 = 0; t0 < num_tokens; t0 += tile_tokens) {
    const int64_t n = std::min(tile_tokens, num_tokens - t0);
    TESSERA_RETURN_IF_ERROR(AttendTile(c, rope, w, batch, kv, kv_layer, cp, t0, n, s, pool));
    float* out = s.proj.data() + (whole_step ? t0 * dim : 0);
    Linear(w.wo, s.attn.data(), n, out, pool);
    if (!whole_step) {
      AddBias(out, w.bo, n);
      AddInto(s.x.data() + t0 * dim, out, n * dim);
    }
  }
  if (whole_step) {
    // A dense FFN starts with its gate; an MoE layer's experts are not known yet.
    TESSERA_RETURN_IF_ERROR(
        ReduceRowParallel(std::span<float>(s.proj.data(), static_cast<size_t>(num_tokens * dim)),
                          tp, c.is_moe() ? nullptr : &w.ffn_gate));
    AddBias(s.proj.data(), w.bo, num_tokens);
    AddInto(s.x.data(), s.proj.data(), num_tokens * dim);
  }
  return Status::Ok();
}

Status DenseFfnBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                     int64_t tile_tokens, LlamaScratch& s, ThreadPool& pool, TensorParallelOps* tp,
                     const WeightMatrix* next) {
  const int64_t dim = c.dim;
  const int64_t tile = std::min(tile_tokens, num_tokens);
  const bool whole_step = tp != nullptr;  // as in AttentionBlock
  s.h.resize(static_cast<size_t>(tile * dim));
  s.proj.resize(static_cast<size_t>((whole_step ? num_tokens : tile) * dim));
  for (int64_t t0 = 0; t0 < num_tokens; t0 += tile_tokens) {
    const int64_t n = std::min(tile_tokens, num_tokens - t0);
    float* out = s.proj.data() + (whole_step ? t0 * dim : 0);
    NormRows(s.x.data() + t0 * dim, w.ffn_norm, c.rms_eps, n, dim, s.h.data(), pool);
    SwiGluFfn(w.ffn_gate, w.ffn_up, w.ffn_down, s.h.data(), n, s.gate, s.up, out, pool);
    if (!whole_step) AddInto(s.x.data() + t0 * dim, out, n * dim);
  }
  if (whole_step) {
    TESSERA_RETURN_IF_ERROR(ReduceRowParallel(
        std::span<float>(s.proj.data(), static_cast<size_t>(num_tokens * dim)), tp, next));
    AddInto(s.x.data(), s.proj.data(), num_tokens * dim);
  }
  return Status::Ok();
}

namespace {

// Sequence parallelism's block, chunk by chunk: the normalised pieces gathered
// (GatherNormedChunk with `norm`), `tile_fn(chunk, t, n)` (a Status) over the chunk's rows
// [t, t + n) a tile at a time, each writing its row-parallel partial sums to
// s.proj's rows [t, t + n), then those reduce-scattered and added with `bias`.
template <typename TileFn>
Status RunSequenceChunks(const ModelConfig& c, std::span<const float> norm,
                         std::span<const float> bias, const ShardLayout& layout,
                         int64_t tile_tokens, LlamaScratch& s, ThreadPool& pool,
                         TensorParallelOps& tp, TileFn&& tile_fn) {
  const int64_t tile = std::min(tile_tokens, parallel::kSequenceChunkTokens);
  for (const parallel::SequenceChunk& chunk : s.sp_chunks) {
    TESSERA_RETURN_IF_ERROR(
        GatherNormedChunk(c, norm, chunk, layout.tp_rank, layout.tp_size, s, pool, tp));
    s.proj.resize(static_cast<size_t>(chunk.piece * layout.tp_size * c.dim));
    // The model's own tile inside the chunk: the activations stay tile-sized.
    for (int64_t t = 0; t < chunk.n; t += tile) {
      TESSERA_RETURN_IF_ERROR(tile_fn(chunk, t, std::min(tile, chunk.n - t)));
    }
    TESSERA_RETURN_IF_ERROR(ScatterAddChunk(c, bias, chunk, layout.tp_size, s, tp));
  }
  return Status::Ok();
}

}  // namespace

Status AttentionBlockSequenceParallel(const ModelConfig& c, const kernels::RopeParams& rope,
                                      const LlamaLayerWeights& w, const ForwardBatch& batch,
                                      const KvView& kv, const KvLayerView& kv_layer,
                                      const ShardLayout& layout, int64_t tile_tokens,
                                      LlamaScratch& s, ThreadPool& pool, TensorParallelOps& tp) {
  const int64_t tile = std::min(tile_tokens, parallel::kSequenceChunkTokens);
  s.q.resize(static_cast<size_t>(tile * c.q_dim()));
  s.k.resize(static_cast<size_t>(tile * c.kv_dim()));
  s.v.resize(static_cast<size_t>(tile * c.kv_dim()));
  s.attn.resize(static_cast<size_t>(tile * c.q_dim()));
  return RunSequenceChunks(
      c, w.attn_norm, w.bo, layout, tile_tokens, s, pool, tp,
      [&](const parallel::SequenceChunk& chunk, int64_t t, int64_t n) {
        // No context parallelism here (MakePartition refuses cp with sp).
        TESSERA_RETURN_IF_ERROR(AttendNormedTile(c, rope, w, batch, kv, kv_layer, {}, chunk.row + t,
                                                 n, s.h.data() + t * c.dim, s, pool));
        Linear(w.wo, s.attn.data(), n, s.proj.data() + t * c.dim, pool);
        return Status::Ok();
      });
}

Status DenseFfnBlockSequenceParallel(const ModelConfig& c, const LlamaLayerWeights& w,
                                     const ShardLayout& layout, int64_t tile_tokens,
                                     LlamaScratch& s, ThreadPool& pool, TensorParallelOps& tp) {
  return RunSequenceChunks(c, w.ffn_norm, {}, layout, tile_tokens, s, pool, tp,
                           [&](const parallel::SequenceChunk&, int64_t t, int64_t n) {
                             SwiGluFfn(w.ffn_gate, w.ffn_up, w.ffn_down, s.h.data() + t * c.dim, n,
                                       s.gate, s.up, s.proj.data() + t * c.dim, pool);
                             return Status::Ok();
                           });
}

}  // namespace tessera::model
