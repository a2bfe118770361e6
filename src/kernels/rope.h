// Rotary position embedding with llama.cpp's semantics (ggml_rope_ext): the
// "normal" layout rotates adjacent pairs (x[2i], x[2i+1]) (LLAMA), the NeoX layout
// rotates (x[i], x[i + n_dims/2]); frequency base, linear scaling (freq_scale),
// YaRN (ext_factor, attn_factor, beta_fast/slow, n_ctx_orig) and optional per-pair
// frequency factors (llama-3 rope_freqs). Layer: kernels; called by model/.
// Pure functions, thread-safe. Dimensions at and past n_dims are left unchanged.
#pragma once

#include <cstdint>
#include <span>

namespace tessera::kernels {

enum class RopeLayout { kNormal, kNeox };

struct RopeParams {
  int n_dims = 0;  // rotated dimensions per head (even, <= head_dim)
  RopeLayout layout = RopeLayout::kNormal;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / linear scaling factor
  float ext_factor = 0.0f;   // YaRN extrapolation mix; 0 disables YaRN
  float attn_factor = 1.0f;  // magnitude scale of cos/sin
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;                   // YaRN: training context length
  std::span<const float> freq_factors;  // empty or n_dims/2 divisors of theta
};

// The n_dims/2 (cos, sin) pairs of position pos, computed as ggml computes them
// (theta advanced by repeated multiplication in f32, cos/sin scaled by mscale).
void RopeCosSin(const RopeParams& params, int64_t pos, float* cos, float* sin);

// Rotates x: [n_heads, head_dim] in place for position pos.
void Rope(const RopeParams& params, int64_t pos, float* x, int64_t n_heads, int64_t head_dim);

}  // namespace tessera::kernels
