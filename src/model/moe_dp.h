// Data-parallel attention's MoE layer (parallel::Partition::dp): each of the dp
// ranks runs its own sequences — its residual stream holds its own tokens only —
// and the experts are spread over the same ranks as under expert parallelism
// (ExpertOwner, or a placement with copies). Layer: model; LlamaModel::RunLayers
// calls MoeBlockDataParallel instead of MoeBlockExpertParallel when its shard has
// dp_attention.
//
// One MoE layer on dp rank r with T tokens (T may be 0: a padding step):
//   1. its tokens normalised and routed (the router is replicated);
//   2. each (token, choice) row is computed by a holder of its expert: r itself
//      when it holds one, else the holder r has given the fewest rows so far in this
//      layer (ties: the first listed);
//   3. counts: one all-to-all of [ep, num_experts] row counts, so every rank knows
//      how many rows of each expert each peer sends it;
//   4. dispatch: one all-to-allv of the rows' normalised inputs, packed peer by
//      peer, expert by expert, (token, choice) order inside;
//   5. each expert held here runs once on its rows: r's own, then each peer's in
//      rank order (one batched matmul; every row is computed alone);
//   6. combine: the outputs go back by the reverse all-to-allv, in the order they came;
//   7. r mixes its tokens (MixExpertOutputs, the one-rank order) and adds the
//      shared expert (qwen2moe; held whole, run on r's tokens).
// A rank with no token still enters 3, 4 and 6 with empty counts, so no peer
// waits forever for it. Every row is computed as on one rank, so a sequence's
// logits are bit-identical to ep = 1, whichever rank runs it.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_weights.h"
#include "model/shard.h"

namespace tessera::model {

// x += moe_ffn(rmsnorm(x)) on this rank's `num_tokens` tokens in the stage's layer
// `layer` (0 = its first; see the file comment). `ops` must implement
// ExpertAllToAllCounts and ExpertAllToAllv over the dp ranks. Records the step's
// load statistics in `s` (this rank's tokens' rows in expert_rows_step and
// expert_rows_layer_step; the rows its experts computed; the rows it sent and
// received).
Status MoeBlockDataParallel(const ModelConfig& c, const ShardLayout& layout, int64_t layer,
                            const LlamaLayerWeights& w, int64_t num_tokens, LlamaScratch& s,
                            ThreadPool& pool, TensorParallelOps& ops);

}  // namespace tessera::model
