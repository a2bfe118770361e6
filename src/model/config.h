// ModelConfig: the hyper-parameters of a llama-family model (llama, mistral,
// qwen2, qwen2moe; dense or Mixtral-style MoE) read from GGUF metadata, and the
// check that every tensor the architecture needs is present with the right shape.
// Layer: model; the forward pass, the KV cache sizing and `tessera inspect` use it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"

namespace tessera::model {

// How RoPE pairs dimensions: kNormal rotates (x[2i], x[2i+1]) (llama), kNeox rotates
// (x[i], x[i + rope_dim/2]) (qwen2, GPT-NeoX).
enum class RopeLayout { kNormal, kNeox };
enum class RopeScaling { kNone, kLinear, kYarn };

std::string_view RopeLayoutName(RopeLayout layout);     // "normal" / "neox"
std::string_view RopeScalingName(RopeScaling scaling);  // "none" / "linear" / "yarn"

struct ModelConfig {
  std::string arch;  // general.architecture: "llama", "qwen2", "qwen2moe"
  std::string name;  // general.name, may be empty

  int64_t vocab_size = 0;      // rows of token_embd
  int64_t context_length = 0;  // trained context (<arch>.context_length)
  int64_t dim = 0;             // embedding_length (hidden size)
  int64_t num_layers = 0;      // block_count
  int64_t num_heads = 0;       // attention.head_count
  int64_t num_kv_heads = 0;    // attention.head_count_kv (GQA), = num_heads when absent
  int64_t head_dim = 0;        // attention.key_length, else dim / num_heads
  int64_t ffn_dim = 0;         // feed_forward_length (dense FFN hidden size)
  float rms_eps = 1e-5f;       // attention.layer_norm_rms_epsilon

  // RoPE.
  float rope_theta = 10000.0f;  // rope.freq_base
  int64_t rope_dim = 0;         // rope.dimension_count, else head_dim
  RopeLayout rope_layout = RopeLayout::kNormal;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;   // positions are divided by this (linear, yarn)
  int64_t rope_original_context = 0;  // rope.scaling.original_context_length (yarn)
  float rope_yarn_beta_fast = 32.0f;  // yarn ramp (llama.cpp defaults)
  float rope_yarn_beta_slow = 1.0f;
  float rope_yarn_ext_factor = 0.0f;  // 1 for yarn, 0 otherwise
  float rope_yarn_attn_factor = 1.0f;
  // rope_freqs.weight present ([rope_dim / 2] f32, Llama 3.1+): frequency i is
  // divided by its factor (llama.cpp's "freq_factors").
  bool rope_freq_factors = false;

  // Mixture of experts (num_experts == 0: dense).
  int64_t num_experts = 0;            // expert_count
  int64_t num_experts_used = 0;       // expert_used_count (top-k)
  int64_t expert_ffn_dim = 0;         // expert_feed_forward_length, else ffn_dim
  int64_t shared_expert_ffn_dim = 0;  // expert_shared_feed_forward_length (qwen2moe), 0: none

  // Tensor-presence facts.
  bool attn_qkv_bias = false;     // blk.N.attn_{q,k,v}.bias present (qwen2)
  bool attn_output_bias = false;  // blk.N.attn_output.bias present
  bool tied_output = false;       // no output.weight: logits use token_embd.weight

  bool is_moe() const { return num_experts > 0; }
  int64_t q_dim() const { return num_heads * head_dim; }      // attn_q output width
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // attn_k/attn_v output width
  int64_t gqa_group() const { return num_heads / num_kv_heads; }
};

// Reads and validates the hyper-parameters (arch llama, mistral, qwen2, qwen2moe).
// Unknown architectures and inconsistent values are InvalidArgument errors naming
// the key. Looks at tensors only for the presence facts and the vocabulary size.
Result<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// A tensor the architecture expects.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] innermost
  bool is_matrix = false;     // any supported weight type; otherwise (norms, biases) f32
};

// Every tensor `config` implies, in load order (globals, then layer by layer).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Checks each expected tensor: present, exact dims, allowed type; the message names
// the tensor ("blk.3.attn_k.weight has shape [64, 16], expected [64, 32]").
Status ValidateModelTensors(const GgufFile& file, const ModelConfig& config);

// "blk.7.attn_q.weight" from (7, "attn_q.weight").
std::string BlockTensorName(int64_t layer_idx, std::string_view suffix);

}  // namespace tessera::model
