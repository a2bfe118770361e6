// ModelShard: which part of a llama-family model one rank holds under tensor and
// pipeline parallelism — a contiguous range of layers (its pipeline stage) and,
// inside each, a tensor-parallel slice: a range of query heads with their KV heads,
// a range of FFN (and expert FFN) rows, and a range of the vocabulary. Layer:
// model; parallel/ builds shards from a plan, LlamaModel::Load binds one.
//
// The split rules (ValidateShard) keep results bit-identical to one rank:
// column-parallel matrices (wq/wk/wv, gate/up, the output head) are split by
// output rows, which leaves every output element's arithmetic untouched;
// row-parallel matrices (wo, ffn_down) are split by input columns on kernels/'s
// canonical K-chunk boundaries, so each rank computes a subtree of the chunk tree
// and the deterministic all-reduce (the same balanced tree over ranks) completes
// it. That needs tp to divide the chunk count of every row-parallel matrix.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "parallel/partition.h"

namespace tessera::model {

struct ModelShard {
  int tp_rank = 0;
  int tp_size = 1;
  // Expert parallelism (ep_size > 1): this rank holds whole experts, those
  // ExpertOwner places on ep_rank, instead of a tp slice of every expert.
  int ep_rank = 0;
  int ep_size = 1;
  // ep > 1: every expert's holders (empty: each expert at home alone, ExpertOwner),
  // and the replica slots a rank has beyond its num_experts / ep home experts.
  parallel::ExpertPlacement expert_placement;
  int ep_redundant = 0;
  // Context parallelism (cp_size > 1): the same weights, but this rank's KV cache
  // holds only the spans parallel::ContextSpanOwner gives cp_rank.
  int cp_rank = 0;
  int cp_size = 1;
  // Data-parallel attention (parallel::Partition::dp): the ep ranks each run their
  // own tokens (tp_size 1), and MoE layers move rows between them (moe_dp.h).
  bool dp_attention = false;
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1 = through the last layer

  bool is_whole() const {
    return tp_size == 1 && ep_size == 1 && cp_size == 1 && layer_begin == 0 && layer_end < 0;
  }
};

// The expert→EP-rank placement: contiguous, num_experts / ep_size experts a rank
// (expert e on rank e / (num_experts / ep_size)).
int ExpertOwner(int64_t expert, int64_t num_experts, int ep_size);

// A half-open index range.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The shard's ranges, resolved against a config.
struct ShardLayout {
  int tp_rank = 0;
  int tp_size = 1;
  Range layers;             // global layer indices
  bool first_stage = true;  // holds the token embedding
  bool last_stage = true;   // holds the final norm and the output head
  Range heads;              // query heads
  Range kv_heads;    // KV heads (replicated over tp / num_kv_heads ranks when tp exceeds them)
  Range ffn;         // dense FFN rows (gate/up rows, ffn_down columns)
  Range expert_ffn;  // each expert's FFN rows (all of them under expert parallelism)
  int ep_rank = 0;
  int ep_size = 1;
  Range experts;  // the experts at home on this rank (all of them when ep_size is 1)
  // ep > 1: the placement (ContiguousPlacement by default) and, for each of this
  // stage's layers, the experts this rank holds there, home and replicas,
  // ascending; ep = 1: every expert.
  parallel::ExpertPlacement expert_placement;
  std::vector<std::vector<int32_t>> held_experts;  // [layer of the stage]
  // ep > 1: the experts a layer can hold (model/expert_slots.h): num_experts / ep +
  // ep_redundant, or more when the placement gives this rank more in some layer.
  int64_t expert_slots = 0;
  int cp_rank = 0;  // context parallelism (ModelShard::cp_rank)
  int cp_size = 1;
  bool dp_attention = false;  // ModelShard::dp_attention
  Range shared_ffn;           // the qwen2moe shared expert's FFN rows
  Range vocab;                // embedding and output-head rows
  int64_t vocab_block = 0;    // ⌈vocab / tp⌉: every rank's padded share of the logits

  // The dims this rank computes with: heads, KV heads and FFN widths of its
  // slice, num_layers of its stage; everything else as in the model.
  ModelConfig LocalConfig(const ModelConfig& full) const;
};

// Resolves `shard` against `config`, or InvalidArgument saying which rule it breaks
// ("tp (3) must divide the 8 query heads", "--ep 3 must divide the 8 experts",
// "--ep 2 needs a mixture-of-experts model"). Checks only the hyper-parameters.
Result<ShardLayout> ResolveShard(const ModelConfig& config, const ModelShard& shard);

// ResolveShard plus the tensor-type rules: every row-parallel matrix's K-chunk
// count must be a multiple of tp (the message names the tensor, its type and
// columns). Reads tensor infos only, never weight data.
Result<ShardLayout> ValidateShard(const GgufFile& file, const ModelConfig& config,
                                  const ModelShard& shard);

// The shard of `rank` in `plan`.
ModelShard ShardOf(const parallel::Partition& plan, int rank);

// parallel::MakePartition over this model's layer and head bytes, then every
// rank's shard validated (ValidateShard): the plan a run can use, refused with the
// reason before any weight is read.
Result<parallel::Partition> PartitionForModel(const GgufFile& file, const ModelConfig& config,
                                              const parallel::PartitionRequest& request);

}  // namespace tessera::model
