// Expert parallelism for the MoE FFN: a stage's tp ranks form groups of ep
// consecutive ranks, each holding num_experts / ep whole experts (ExpertOwner).
// Layer: model; LlamaModel::RunLayers calls MoeBlockExpertParallel instead of
// MoeBlock when its shard has ep > 1.
//
// One MoE layer on tp rank r of EP group G (ranks g·ep .. g·ep + ep − 1):
//   0. (parallel/expert_placement.h) an expert may have copies on several ranks:
//      AssignExpertRows picks the one computing each (token, choice) row;
//   1. the step's T tokens are split over the tp ranks (ChunkOf: ⌈T/tp⌉ first):
//      r owns its chunk and G serves the chunks of its members;
//   2. every rank routes every token (the router is replicated, so each rank knows
//      how many rows every peer will send it: no count exchange);
//   3. dispatch is free: the tp group's residual stream is replicated, so a rank
//      reads the rows its experts serve from its own normalised copy;
//   4. each local expert runs once, one batched matmul over its rows (token
//      order, as on one rank);
//   5. combine: one all-to-allv over G returns each (token, choice) output to the
//      token's owner; a token whose experts are all on its owner moves no bytes;
//   6. the owner mixes its tokens (MixExpertOutputs, the one-rank order) and adds
//      the shared expert (qwen2moe; held whole, run on the owner's tokens);
//   7. an all-gather over the tp group of the owners' updated rows restores the
//      replicated residual stream.
// Every row is computed as on one rank, so logits are bit-identical to ep = 1.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_weights.h"
#include "parallel/expert_placement.h"

namespace tessera::model {

// Rows [begin, end) of T split over `parts` ranks, the first T % parts one longer
// (plan::ChunkElems's split).
struct TokenChunk {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
TokenChunk ChunkOf(int64_t num_tokens, int parts, int index);

// One token's mix, shared by the one-rank and the expert-parallel paths so both
// add in the same order: x += Σ_k weights[k] · outs[k] (k best first, summed into
// `mix` from zero), then, with a shared expert, x += sigmoid(shared_gate_logit) ·
// shared_out. outs: [K, dim]; shared_out: [dim] or empty; mix: [dim] scratch.
void MixExpertOutputs(std::span<const float> weights, std::span<const float> outs,
                      std::span<const float> shared_out, float shared_gate_logit,
                      std::span<float> x, std::span<float> mix);

// Which EP rank of the group computes each (token, choice) row of the group's
// tokens (s.ep_assign, from the group's first row; s.expert_choice routed): the
// expert's only holder; with replicas the holder with the fewest rows assigned so
// far in this layer (ties: the token's own rank, which sends nothing back, else the
// first listed). Every rank of the group computes the same table.
void AssignExpertRows(const parallel::ExpertHolders& holders, int64_t num_tokens, size_t K,
                      int tp_size, int group_first, int ep, LlamaScratch& s);

// x += moe_ffn(rmsnorm(x)) with this rank's experts in the stage's layer `layer`
// (0 = its first; see the file comment). `tp` must implement ExpertAllToAllv and
// AllGatherBlocks. Records the step's load statistics in `s` (expert_rows_step,
// expert_rows_layer_step, ep_rows_*_step).
Status MoeBlockExpertParallel(const ModelConfig& c, const ShardLayout& layout, int64_t layer,
                              const LlamaLayerWeights& w, int64_t num_tokens, LlamaScratch& s,
                              ThreadPool& pool, TensorParallelOps& tp);

}  // namespace tessera::model
