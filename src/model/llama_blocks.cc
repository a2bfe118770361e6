#include "model/llama_blocks.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace tessera::model {
namespace {

// Tokens per pass through a dense FFN (DenseFfnBlock).
constexpr int64_t kFfnTileTokens = 256;

// y[t] += bias for each of the num_tokens rows (no-op when bias is empty).
void AddBias(float* y, std::span<const float> bias, int64_t num_tokens) {
  if (bias.empty()) return;
  const size_t n = bias.size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::span<float> row(y + static_cast<size_t>(t) * n, n);
    kernels::Add(row, bias, row);
  }
}

}  // namespace

void Linear(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  kernels::MatMul(w.view(), x, n, y, {.k_chunks = w.k_chunks}, &pool);
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
  Linear(gate, x, n, gate_buf.data(), pool);
  Linear(up, x, n, up_buf.data(), pool);
  kernels::SwiGlu(std::span<const float>(gate_buf.data(), elems),
                  std::span<const float>(up_buf.data(), elems),
                  std::span<float>(gate_buf.data(), elems));
  Linear(down, gate_buf.data(), n, out, pool);
}

Status ReduceRowParallel(std::span<float> partial, TensorParallelOps* tp,
                         const WeightMatrix* next) {
  return tp != nullptr ? tp->AllReduceSum(partial, next) : Status::Ok();
}

Status AttentionBlock(const ModelConfig& c, const kernels::RopeParams& rope,
                      const LlamaLayerWeights& w, const ForwardBatch& batch, const KvView& kv,
                      const KvLayerView& kv_layer, LlamaScratch& s, ThreadPool& pool,
                      TensorParallelOps* tp) {
  const int64_t num_tokens = static_cast<int64_t>(batch.tokens.size());
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  NormRows(s.x.data(), w.attn_norm, c.rms_eps, num_tokens, dim, s.h.data(), pool);
  Linear(w.wq, s.h.data(), num_tokens, s.q.data(), pool);
  Linear(w.wk, s.h.data(), num_tokens, s.k.data(), pool);
  Linear(w.wv, s.h.data(), num_tokens, s.v.data(), pool);
  AddBias(s.q.data(), w.bq, num_tokens);
  AddBias(s.k.data(), w.bk, num_tokens);
  AddBias(s.v.data(), w.bv, num_tokens);

  // RoPE at each token's position, then append its K/V to its sequence's blocks.
  int64_t first = 0;
  for (const ForwardSequence& seq : batch.sequences) {
    pool.ParallelFor(seq.num_tokens, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = first + i, pos = seq.start_position + i;
        kernels::Rope(rope, pos, s.q.data() + row * q_dim, c.num_heads, c.head_dim);
        kernels::Rope(rope, pos, s.k.data() + row * kv_dim, c.num_kv_heads, c.head_dim);
        kernels::StoreKv(kv.layout, seq.block_table, pos, s.k.data() + row * kv_dim,
                         s.v.data() + row * kv_dim, kv_layer.k, kv_layer.v);
      }
    });
    first += seq.num_tokens;
  }

  // Each token attends to its own sequence's positions [0, pos]. One sequence:
  // the kernel spreads KV-head groups over the pool; several: one per thread.
  const kernels::PagedKv paged{
      .layout = kv.layout, .k = kv_layer.k, .v = kv_layer.v, .n_blocks = kv.num_blocks};
  std::vector<int64_t>& starts = s.sequence_starts;
  starts.clear();
  first = 0;
  for (const ForwardSequence& seq : batch.sequences) {
    starts.push_back(first);
    first += seq.num_tokens;
  }
  auto attend = [&](size_t idx, ThreadPool* inner) {
    const ForwardSequence& seq = batch.sequences[idx];
    const int64_t row = starts[idx];
    kernels::AttentionMulti(paged, seq.block_table, s.q.data() + row * q_dim, c.num_heads,
                            seq.start_position, seq.num_tokens, s.attn.data() + row * q_dim, inner);
  };
  if (batch.sequences.size() == 1) {
    attend(0, &pool);
  } else {
    pool.ParallelFor(static_cast<int64_t>(batch.sequences.size()), [&](int64_t b, int64_t e) {
      for (int64_t idx = b; idx < e; ++idx) attend(static_cast<size_t>(idx), nullptr);
    });
  }

  Linear(w.wo, s.attn.data(), num_tokens, s.proj.data(), pool);
  // A dense FFN starts with its gate; an MoE layer's experts are not known yet.
  TESSERA_RETURN_IF_ERROR(
      ReduceRowParallel(std::span<float>(s.proj.data(), static_cast<size_t>(num_tokens * dim)), tp,
                        c.is_moe() ? nullptr : &w.ffn_gate));
  AddBias(s.proj.data(), w.bo, num_tokens);
  AddInto(s.x.data(), s.proj.data(), num_tokens * dim);
  return Status::Ok();
}

Status DenseFfnBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                     LlamaScratch& s, ThreadPool& pool, TensorParallelOps* tp,
                     const WeightMatrix* next) {
  NormRows(s.x.data(), w.ffn_norm, c.rms_eps, num_tokens, c.dim, s.h.data(), pool);
  // At most kFfnTileTokens tokens at a time: the gate and up activations ([tokens, ffn]
  // each, the step's largest) stay that size however many tokens the step has. A
  // token's output does not depend on the others in its matmul (batch invariance), so
  // the bits are the same.
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kFfnTileTokens) {
    const int64_t n = std::min(kFfnTileTokens, num_tokens - t0);
    SwiGluFfn(w.ffn_gate, w.ffn_up, w.ffn_down, s.h.data() + t0 * c.dim, n, s.gate, s.up,
              s.proj.data() + t0 * c.dim, pool);
  }
  TESSERA_RETURN_IF_ERROR(ReduceRowParallel(
      std::span<float>(s.proj.data(), static_cast<size_t>(num_tokens * c.dim)), tp, next));
  AddInto(s.x.data(), s.proj.data(), num_tokens * c.dim);
  return Status::Ok();
}

}  // namespace tessera::model
