// Deterministic random-weight llama-family models (dense or Mixtral-style MoE) of
// any shape, written as GGUF files that tessera and llama.cpp both load; for tests
// and speed benchmarks. Layer: model; `tessera synth` and tests call it.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "kernels/weight_type.h"

namespace tessera::model {

struct SynthOptions {
  bool moe = false;        // --arch moe: ffn_gate_inp + ffn_{gate,up,down}_exps
  int64_t dim = 0;         // embedding_length
  int64_t num_layers = 0;  // block_count
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0: = num_heads
  int64_t ffn_dim = 0;       // dense FFN / per-expert hidden size
  int64_t num_experts = 0;   // MoE only
  int64_t num_experts_used = 0;
  // MoE only: > 0 writes a qwen2moe model (general.architecture qwen2moe) with a
  // sigmoid-gated shared expert of this hidden size beside the routed experts.
  int64_t shared_expert_ffn_dim = 0;
  // MoE: > 0 makes the router favour the first quarter of the experts (a skewed load
  // for expert-parallel balancing; 0.4 gives them about half the rows, 1 nearly all).
  float router_skew = 0;
  // With router_skew: layer l favours the (l mod 4)-th quarter instead of the first
  // (with fewer than 4 experts, l mod their count), so each layer has its own hot
  // experts (as in trained MoE models) and the load summed over the layers is
  // about flat.
  bool router_skew_by_layer = false;
  int64_t vocab_size = 0;  // 0: from vocab_from, else 512 (synthetic vocabulary)
  int64_t context_length = 2048;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  // Matrices (token_embd and output included) in this type; norms and the MoE
  // router stay f32. f32, f16, bf16, q8_0, q4_0, q4_k or q6_k (the K-quants rounded to
  // nearest: kernels::QuantizeRow).
  kernels::WeightType type = kernels::WeightType::kF16;
  std::string vocab_from;  // copy tokenizer.* metadata from this GGUF (else synthetic SPM)
  uint64_t seed = 0;
  std::string name;          // general.name; empty: derived from the shape
  bool tied_output = false;  // no output.weight: the head is token_embd
  // Blocks from `damp_from` on (-1: none) write `damp` x their random outputs into
  // the residual stream (attn_output and ffn_down scaled). With damp 0 the model
  // computes what its first damp_from blocks compute: a synthetic model of
  // damp_from blocks and the same seed is then an exact draft for it (tensors
  // are seeded by name), and a small damp makes the two agree less.
  int64_t damp_from = -1;
  float damp = 1.0f;
};

// Writes the model to `path`, streaming tensor data (memory use is a few rows, not
// the model). Same options and seed → the same bytes. Weights are uniform with
// standard deviation 1/sqrt(fan_in) (embeddings: 1), norms 1, so activations stay
// O(1) through any depth. InvalidArgument for inconsistent shapes.
Status WriteSynthModel(const SynthOptions& options, const std::string& path);

}  // namespace tessera::model
