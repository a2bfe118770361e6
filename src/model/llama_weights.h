// LlamaWeights: every weight of a llama-family model (dense or Mixtral/qwen2moe
// MoE) as a view into the memory-mapped GGUF — nothing is copied. Layer: model;
// built by LlamaModel::Load, read by the forward pass (llama.cc, moe.cc). Under
// tensor/pipeline parallelism a rank binds only its shard (parallel/ builds the
// views of repacked slices). Immutable after binding; safe to read from many threads.
//
// Shapes are written [rows, cols] in memory order: a matrix of `rows` output
// features, each a row of `cols` input features (ggml's ne = [cols, rows]).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "kernels/matmul.h"
#include "kernels/weight_type.h"
#include "model/config.h"
#include "model/expert_slots.h"
#include "model/gguf.h"

namespace tessera::model {

// One weight matrix, y = W x: `rows` outputs, each a dot product over `cols` inputs.
struct WeightMatrix {
  kernels::WeightType type = kernels::WeightType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::span<const uint8_t> data;  // [rows, RowBytes(type, cols)]
  std::string_view name;          // the GGUF tensor name, for messages
  // K chunks of the matmul's reduction tree (kernels/matmul.h); 0 = canonical for
  // cols. A row-parallel shard keeps its share of the full matrix's chunks.
  int k_chunks = 0;
  // kInterleaved8: interleaved at load for the matmul kernel (kernels/matmul.h); row()
  // then does not apply.
  kernels::WeightLayout layout = kernels::WeightLayout::kRows;

  bool empty() const { return data.empty(); }
  size_t row_bytes() const { return data.size() / static_cast<size_t>(rows); }
  const uint8_t* row(int64_t r) const {
    TESSERA_CHECK(layout == kernels::WeightLayout::kRows) << name;
    return data.data() + static_cast<size_t>(r) * row_bytes();
  }
  // What kernels::MatMul multiplies by.
  kernels::WeightView view() const {
    return {.type = type,
            .data = data.data(),
            .rows = rows,
            .cols = cols,
            .row_bytes = static_cast<int64_t>(row_bytes()),
            .layout = layout};
  }
  // Output rows [begin, end): a view, nothing copied.
  WeightMatrix Rows(int64_t begin, int64_t end) const;
};

struct LlamaLayerWeights {
  std::span<const float> attn_norm;  // [dim]
  WeightMatrix wq;                   // [num_heads * head_dim, dim]     column-parallel
  WeightMatrix wk;                   // [num_kv_heads * head_dim, dim]  column-parallel
  WeightMatrix wv;                   // [num_kv_heads * head_dim, dim]  column-parallel
  WeightMatrix wo;                   // [dim, num_heads * head_dim]     row-parallel
  std::span<const float> bq;         // [num_heads * head_dim] or empty (qwen2)
  std::span<const float> bk;         // [num_kv_heads * head_dim] or empty
  std::span<const float> bv;         // [num_kv_heads * head_dim] or empty
  std::span<const float> bo;         // [dim] or empty
  std::span<const float> ffn_norm;   // [dim]

  // Dense FFN (num_experts == 0).
  WeightMatrix ffn_gate;  // [ffn_dim, dim]  column-parallel
  WeightMatrix ffn_up;    // [ffn_dim, dim]  column-parallel
  WeightMatrix ffn_down;  // [dim, ffn_dim]  row-parallel

  // MoE FFN: router and one view per expert into the 3-D ffn_*_exps tensors
  // (GGUF [cols, rows, num_experts]: expert e's matrix is the e-th slab).
  WeightMatrix router;                    // ffn_gate_inp: [num_experts, dim]
  std::vector<WeightMatrix> expert_gate;  // num_experts x [expert_ffn_dim, dim]
  std::vector<WeightMatrix> expert_up;    // num_experts x [expert_ffn_dim, dim]
  std::vector<WeightMatrix> expert_down;  // num_experts x [dim, expert_ffn_dim]
  // qwen2moe shared expert, gated per token by sigmoid(shared_gate . x); empty if none.
  WeightMatrix shared_gate;      // ffn_gate_inp_shexp: [1, dim]
  WeightMatrix shared_ffn_gate;  // [shared_expert_ffn_dim, dim]
  WeightMatrix shared_ffn_up;    // [shared_expert_ffn_dim, dim]
  WeightMatrix shared_ffn_down;  // [dim, shared_expert_ffn_dim]
};

// Every weight a rank holds. Whole model: all of it. A shard (model/shard.h): the
// layers of its stage (layers[i] is global layer layers_begin + i), the embedding
// on the first stage, final norm and output head on the last, and inside them its
// tensor-parallel slices (row ranges are views into the mapping; the column
// slices of row-parallel matrices are repacked into `owned`). Q8_0/Q4_0 matrices the
// matmul kernel reads (kernels::CanInterleave8) are interleaved into `owned`
// too, and their pages in the mapping released.
struct LlamaWeights {
  WeightMatrix token_embd;  // [vocab rows held, dim] (looked up, not multiplied); empty off stage 0
  std::vector<LlamaLayerWeights> layers;
  std::span<const float> output_norm;  // [dim]; empty off the last stage
  WeightMatrix output;                 // [vocab rows held, dim]; = token_embd when tied
  HugePageArena owned;                 // repacked matrices the views point into
  // Expert parallelism: the slots the rank's experts live in (expert_slots.h).
  ExpertSlots expert_slots;

  // Bytes of weights one decode step reads (every matrix once; for MoE only
  // num_experts_used experts per layer), for the bandwidth roofline.
  int64_t decode_bytes_per_token = 0;
  // The same by weight type (the types' GEMV rates differ; they sum to the above).
  std::map<kernels::WeightType, int64_t> decode_bytes_by_type;
  int64_t total_bytes = 0;  // all tensors bound
};

// A 3-D [cols, rows, num_experts] tensor (present and shape-checked by
// ValidateModelTensors) as one view per expert: expert e's matrix is the e-th slab.
std::vector<WeightMatrix> ExpertMatrices(const GgufFile& file, const std::string& name);

// Validates `config` against the file's tensors (ValidateModelTensors) and binds
// every view. `file` must outlive the result.
Result<LlamaWeights> BindLlamaWeights(const GgufFile& file, const ModelConfig& config);

// Binds `layout`'s shard only: the mapping's pages outside it are never touched
// (the column slices are copied out and their source pages released), so a rank's
// resident memory is about its share. `layout` comes from ValidateShard.
struct ShardLayout;
Result<LlamaWeights> BindLlamaShard(const GgufFile& file, const ModelConfig& config,
                                    const ShardLayout& layout);

// Expert parallelism: re-binds w's experts from `from`'s held experts to `to`'s
// (same shard but for the placement), moving only those that change
// (PlaceExperts), and updates the byte totals. InvalidArgument, with nothing
// moved, when `to` holds more experts than a layer has slots.
Status RebindExperts(const GgufFile& file, const ModelConfig& config, const ShardLayout& from,
                     const ShardLayout& to, LlamaWeights& w);

}  // namespace tessera::model
