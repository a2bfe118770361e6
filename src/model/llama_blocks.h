// The blocks of the llama forward pass, each over all T tokens of a step:
// attention (norm, QKV, RoPE, KV append, paged attention, output projection,
// residual) and the dense SwiGLU FFN; moe.h has the MoE FFN. Layer: model;
// called by LlamaModel::Forward only. Every result row depends on its own input
// row alone (batch invariance).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_weights.h"

namespace tessera::model {

// The one place a weight matrix is applied: y[n, w.rows] = x[n, w.cols] · Wᵀ.
// Under tensor parallelism this becomes the sharded linear: column-parallel
// layers (wq/wk/wv, gate/up) compute a slice of the rows; row-parallel layers
// (wo, ffn_down) a slice of the cols followed by the all-reduce, whose fixed
// chunk tree kernels::MatMul already follows inside one rank.
void Linear(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool);

// Linear for several matrices of one input (Q, K and V; gate and up): a decode
// step's products as one parallel job (kernels::MatMulShared), the same bits.
void LinearShared(std::initializer_list<std::pair<const WeightMatrix*, float*>> products,
                  const float* x, int64_t n, ThreadPool& pool);

// out[t] = rmsnorm(x[t]) * weight for each of the num_tokens rows of `dim`.
void NormRows(const float* x, std::span<const float> weight, float eps, int64_t num_tokens,
              int64_t dim, float* out, ThreadPool& pool);

// out[n, down.rows] = down(silu(gate(x)) * up(x)); gate_buf/up_buf are scratch.
void SwiGluFfn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down,
               const float* x, int64_t n, std::vector<float>& gate_buf, std::vector<float>& up_buf,
               float* out, ThreadPool& pool);

// x[i] += y[i] for i < n.
void AddInto(float* x, const float* y, int64_t n);

// Completes a row-parallel product under tensor parallelism (no-op without);
// `next` is the matrix multiplied by next (TensorParallelOps::AllReduceSum).
Status ReduceRowParallel(std::span<float> partial, TensorParallelOps* tp, const WeightMatrix* next);

// The blocks run a step's tokens `tile_tokens` at a time: every activation buffer
// but the residual stream x (and, under tensor parallelism, the row-parallel
// output that one all-reduce completes for the step) holds one tile. A token's row
// depends on its own row alone (batch invariance) and attention reads the earlier
// tiles' K/V from the cache, so the bits do not depend on the tile. The tile: the
// largest power of two in [64, 512] tokens whose activations stay under 1/48 of
// `weight_bytes` (the matmuls lose a few percent per token below ~256 tokens;
// small models' activations would otherwise weigh most).
int64_t BlockTileTokens(const ModelConfig& c, int64_t weight_bytes);

// Whether this rank's KV cache holds position `pos` (its span's owner under
// context parallelism; always without).
bool HoldsPosition(const kernels::KvLayout& layout, const ContextGroup& cp, int64_t pos);

// Rows [t0, t0 + n) of `batch`, normalised input h ([n, dim]): q, k, v ([n, q_dim],
// [n, kv_dim] twice) = h · W (+ bias), RoPE'd at each token's position; the K/V of
// the positions this rank holds appended to `kv_layer`.
void ProjectQkvTile(const ModelConfig& c, const kernels::RopeParams& rope,
                    const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                    const KvLayerView& kv_layer, const ContextGroup& cp, int64_t t0, int64_t n,
                    const float* h, float* q, float* k, float* v, LlamaScratch& s,
                    ThreadPool& pool);

// y[t] += bias for each of the num_tokens rows (no-op when bias is empty).
void AddBias(float* y, std::span<const float> bias, int64_t num_tokens);

// x += attention(rmsnorm(x)); appends the new tokens' K/V to `kv_layer`. `c` is
// the rank's local config (its heads); the output projection is all-reduced
// before the bias and the residual add. Under context parallelism (cp.size > 1)
// every rank runs every row, keeps the K/V of its own spans, and attends over the
// group's (ContextParallelAttention).
Status AttentionBlock(const ModelConfig& c, const kernels::RopeParams& rope,
                      const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                      const KvLayerView& kv_layer, int64_t tile_tokens, LlamaScratch& s,
                      ThreadPool& pool, TensorParallelOps* tp, const ContextGroup& cp = {});

// x += down(silu(gate(h)) * up(h)), h = rmsnorm(x); down's output all-reduced.
// `next`: the matrix after this block (the next layer's wq, or the head).
Status DenseFfnBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                     int64_t tile_tokens, LlamaScratch& s, ThreadPool& pool, TensorParallelOps* tp,
                     const WeightMatrix* next);

// Sequence parallelism (parallel/sequence_shard.h): the same blocks chunk by chunk
// over this rank's pieces of x (scratch.sp_chunks) — the normalised pieces
// all-gathered before the column-parallel products (which run `tile_tokens` rows at
// a time inside the chunk), the row-parallel partial sums reduce-scattered back
// into pieces. The bits equal the all-reduce path's.
Status AttentionBlockSequenceParallel(const ModelConfig& c, const kernels::RopeParams& rope,
                                      const LlamaLayerWeights& w, const ForwardBatch& batch,
                                      const KvView& kv, const KvLayerView& kv_layer,
                                      const ShardLayout& layout, int64_t tile_tokens,
                                      LlamaScratch& s, ThreadPool& pool, TensorParallelOps& tp);
Status DenseFfnBlockSequenceParallel(const ModelConfig& c, const LlamaLayerWeights& w,
                                     const ShardLayout& layout, int64_t tile_tokens,
                                     LlamaScratch& s, ThreadPool& pool, TensorParallelOps& tp);

}  // namespace tessera::model
