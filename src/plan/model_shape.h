// ModelShape: the hyper-parameters of a LLaMA-family dense or MoE model that the
// planner needs (no weights), and the parameter counts derived from them.
// Layer: plan (pure data). Filled from a preset (presets.h) or a GGUF's metadata
// (the CLI converts model/'s config).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace tessera::plan {

// A model's shape as the planner needs it; the field names are model::ModelConfig's
// (the engine's view of a GGUF file), plus what the planner models beyond it.
struct ModelShape {
  std::string name;
  int64_t num_layers = 0;
  int64_t dim = 0;           // hidden size (d_model)
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA: fewer than num_heads)
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;  // dense FFN hidden size (all layers of a dense model, the leading
                        // num_dense_layers of an MoE model)
  int64_t vocab_size = 0;
  int64_t num_experts = 0;            // 0: dense
  int64_t num_experts_used = 0;       // top-k
  int64_t expert_ffn_dim = 0;         // FFN hidden size of one routed expert
  int64_t num_shared_experts = 0;     // always-on experts (Qwen-MoE, DeepSeek)
  int64_t shared_expert_ffn_dim = 0;  // FFN hidden size of one shared expert
  int64_t num_dense_layers = 0;       // leading dense layers of an MoE model (DeepSeek-V3: 3)
  int64_t kv_latent_dim = 0;          // MLA: cached elements per token per layer; 0 = 2*kv*head_dim
  bool tied_output = false;           // the output head is token_embd (no output.weight)
  std::string weight_dtype = "bf16";  // the format the model is usually served in

  bool is_moe() const { return num_experts > 0; }
  bool IsMoeLayer(int64_t layer_idx) const { return is_moe() && layer_idx >= num_dense_layers; }
  int64_t num_moe_layers() const { return is_moe() ? num_layers - num_dense_layers : 0; }
  // K and V elements cached per token per layer for the whole model (all KV heads).
  int64_t KvElemsPerTokenLayer() const {
    return kv_latent_dim > 0 ? kv_latent_dim : 2 * num_kv_heads * head_dim;
  }
};

// InvalidArgument naming the first broken constraint ("heads (30) must be a multiple
// of kv_heads (4)").
Status ValidateModelShape(const ModelShape& model);

// Parameter counts (elements) of the whole model.
struct ParamCounts {
  int64_t attention_per_layer = 0;  // wq + wk + wv + wo
  int64_t norms_per_layer = 0;      // attention and FFN RMSNorm weights
  int64_t dense_ffn_per_layer = 0;  // gate + up + down of a dense layer
  int64_t expert = 0;               // gate + up + down of one routed expert
  int64_t shared_per_layer = 0;     // all shared experts of one MoE layer
  int64_t router_per_layer = 0;     // ffn_gate_inp of one MoE layer
  int64_t embedding = 0;
  int64_t output = 0;  // 0 when tied to the embedding
  int64_t final_norm = 0;

  int64_t Total(const ModelShape& model) const;
  // Parameters one token touches in a forward pass (top-k experts, not all).
  int64_t ActivePerToken(const ModelShape& model) const;
};

ParamCounts CountParams(const ModelShape& model);

}  // namespace tessera::plan
