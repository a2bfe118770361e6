// The Mixtral-style mixture-of-experts FFN: a router (ffn_gate_inp) scores the
// experts per token, softmax → top-k → (llama/Mixtral) renormalise the k weights;
// each expert is a SwiGLU FFN; tokens are grouped per expert so each expert's
// matrices are read once per step; qwen2moe adds a sigmoid-gated shared expert.
// Layer: model; called by LlamaModel::Forward. Batch-invariant: a token's output
// is the sum of its k experts' outputs in rank order, each row computed alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_weights.h"

namespace tessera::model {

// A token's chosen experts, best first, and their mixing weights.
struct ExpertChoice {
  int32_t expert;
  float weight;
};

// Routes one token: softmax over `router_logits` ([num_experts]), the top
// `num_used` (ties to the lower expert id), weights renormalised to sum 1 when
// `renormalize`. Writes num_used choices to `out`.
void RouteToken(std::span<const float> router_logits, int64_t num_used, bool renormalize,
                std::span<ExpertChoice> out);

// s.h = rmsnorm(x) for the T tokens, and each token routed: s.expert_choice and
// s.expert_weight ([T, experts_used], best first). Mixtral (llama arch)
// renormalises the k weights; qwen2moe does not. Sizes s.expert_rows_step.
void NormAndRouteTokens(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                        LlamaScratch& s, ThreadPool& pool);

// Runs expert `e` once on the (token, choice) rows `rows` (indices t·K + k, in
// order), reading each token's input from s.h: out[i] ([dim]) for rows[i], in
// s.proj ([rows, dim]).
void RunExpert(const ModelConfig& c, const LlamaLayerWeights& w, int32_t e,
               std::span<const int32_t> rows, LlamaScratch& s, ThreadPool& pool);
// The same on `n` input rows already in s.expert_in ([n, dim]).
void RunExpertOnInputs(const ModelConfig& c, const LlamaLayerWeights& w, int32_t e, int64_t n,
                       LlamaScratch& s, ThreadPool& pool);

// x += moe_ffn(rmsnorm(x)). Under tensor parallelism every expert's matrices are
// split like a dense FFN; the (token, choice) outputs and the shared expert's
// output are all-reduced together (one call) before they are mixed, so the mix
// sees exactly the single-rank values. `next`: the matrix after this block.
Status MoeBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                LlamaScratch& s, ThreadPool& pool, TensorParallelOps* tp, const WeightMatrix* next);

}  // namespace tessera::model
