// Partition: how a model is split over the world's ranks — tp tensor-parallel
// ranks inside each of pp pipeline stages, each stage's tp group repeated over cp
// context-parallel ranks (a long sequence's KV spread over them), and on MoE
// layers the experts spread over ep of a stage's tp ranks — which ranks
// form which group, and which layers each stage owns. Pure arithmetic on the
// model's layer sizes; model::PartitionForModel adds the per-tensor rules and is what
// callers use, before any weight is read. Layer: parallel.
//
// Rank order (the planner's, plan/traffic.h): tp innermost, then cp, then dp,
// stages outermost — rank = ((stage * dp + dp_rank) * cp + cp_rank) * tp + tp_rank,
// so a stage's tp ranks are contiguous (one host when they fit). A stage's
// dp × cp × tp ranks are its lanes (lane = (dp_rank * cp + cp_rank) * tp + tp_rank);
// the pipeline runs lane by lane. The driver,
// which schedules and samples, is the last stage's lane 0: the logits are gathered
// there, and it sends each step's description to every lane of the first stage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/expert_placement.h"

namespace tessera::parallel {

// --sp-min-tokens' default (docs/parallel.md, "Sequence parallelism": measured).
inline constexpr int64_t kDefaultSpMinTokens = 64;

struct PartitionRequest {
  int tp = 1;
  int pp = 1;
  // Context parallelism: every sequence's KV spans spread zig-zag over cp ranks
  // (parallel/context_shard.h), each holding the whole stage's weights (or its tp
  // slice).
  int cp = 1;
  // Expert parallelism: on MoE layers, each group of ep consecutive tp ranks splits
  // the experts (whole experts, num_experts / ep a rank); ep divides tp.
  int ep = 1;
  // Data-parallel attention (an MoE model, ep == dp, tp = cp = 1): each of dp ranks
  // holds every weight but the experts, runs the attention of its own sequences
  // over its own KV cache, and on MoE layers sends its tokens' rows to the experts'
  // ranks and gets their outputs back (model/moe_dp.h); the experts are split over
  // the dp ranks as under ep. A rank with no sequence in a step still runs it (a
  // padding step: zero rows, every exchange entered).
  int dp = 1;
  // Stage layer ranges, "0-10,11-21" (inclusive, in order, covering every layer);
  // empty = balanced by weight bytes.
  std::string pp_layers;
  // Sequence parallelism (tp >= 2, dense layers): steps of at least sp_min_tokens
  // tokens split their rows over the tp ranks (parallel/sequence_shard.h); shorter
  // ones (decode) run plain tp, whose one collective a block costs less there.
  bool sp = false;
  int64_t sp_min_tokens = kDefaultSpMinTokens;
  // Expert parallelism: replica slots per rank and where the experts live (empty:
  // each at home alone; PartitionForModel checks it against the model).
  int ep_redundant = 0;
  ExpertPlacement expert_placement;
};

// Layers [begin, end) of a stage.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct Partition {
  int tp = 1;
  int pp = 1;
  int cp = 1;                            // context-parallel ranks per stage and tp rank
  int ep = 1;                            // divides tp; 1 = experts TP-sliced like a dense FFN
  int dp = 1;                            // data-parallel attention ranks (PartitionRequest::dp)
  std::vector<LayerRange> stage_layers;  // [pp]
  std::vector<int64_t> stage_bytes;      // [pp] weight bytes each stage reads per token
  int ep_redundant = 0;                  // replica slots per EP rank
  ExpertPlacement expert_placement;      // ep > 1 on an MoE model: every expert's holders
  bool sp = false;                       // sequence parallelism (PartitionRequest::sp)
  int64_t sp_min_tokens = kDefaultSpMinTokens;
  // Whether a step of `tokens` new tokens runs sequence parallel.
  bool SequenceParallelFor(int64_t tokens) const { return sp && tokens >= sp_min_tokens; }

  int world_size() const { return tp * cp * dp * pp; }
  int lanes() const { return tp * cp * dp; }  // ranks per stage
  int StageOf(int rank) const { return rank / lanes(); }
  int LaneOf(int rank) const { return rank % lanes(); }
  int TpRankOf(int rank) const { return rank % tp; }
  int CpRankOf(int rank) const { return LaneOf(rank) / tp % cp; }
  int DpRankOf(int rank) const { return LaneOf(rank) / (tp * cp); }
  // A rank's place in its EP group: ep consecutive tp ranks of its stage (cp = 1),
  // or under data-parallel attention the stage's dp ranks.
  int EpRankOf(int rank) const { return dp > 1 ? DpRankOf(rank) : TpRankOf(rank) % ep; }
  int EpGroupOf(int rank) const {
    return dp > 1 ? StageOf(rank) : StageOf(rank) * (tp / ep) + TpRankOf(rank) / ep;
  }
  int RankOf(int stage, int lane) const { return stage * lanes() + lane; }
  int RankOf(int stage, int tp_rank, int cp_rank) const {
    return RankOf(stage, cp_rank * tp + tp_rank);
  }
  int driver_rank() const { return RankOf(pp - 1, 0); }
  // "tp2 pp2, stages 0-10 | 11-21" ("tp2 ep2 pp1" with ep > 1, "tp2 sp pp1" with sp,
  // "tp1 cp2 pp1" with cp > 1, "tp1 dp2 ep2 pp1" with dp > 1).
  std::string ToString() const;
};

// Checks the degrees against the layer count, and lays out the stages: the
// explicit --pp-layers ranges, or contiguous ranges minimising the largest stage's
// bytes (`layer_bytes` per layer; `head_bytes` counted on the last stage, whose
// output head is a full-vocabulary matmul). InvalidArgument says what is wrong.
Result<Partition> MakePartition(const PartitionRequest& request,
                                const std::vector<int64_t>& layer_bytes, int64_t head_bytes);

}  // namespace tessera::parallel
