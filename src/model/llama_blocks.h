// The blocks of the llama forward pass, each over all T tokens of a step:
// attention (norm, QKV, RoPE, KV append, paged attention, output projection,
// residual) and the dense SwiGLU FFN; moe.h has the MoE FFN. Layer: model;
// called by LlamaModel::Forward only. Every result row depends on its own input
// row alone (batch invariance).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
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

// x += attention(rmsnorm(x)); appends the new tokens' K/V to `kv_layer`.
void AttentionBlock(const ModelConfig& c, const LlamaLayerWeights& w, const ForwardBatch& batch,
                    const KvView& kv, const KvLayerView& kv_layer, LlamaScratch& s,
                    ThreadPool& pool);

// x += down(silu(gate(h)) * up(h)), h = rmsnorm(x).
void DenseFfnBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                   LlamaScratch& s, ThreadPool& pool);

}  // namespace tessera::model
