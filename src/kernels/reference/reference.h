// Scalar reference implementations of every kernel: the test oracles for the SIMD
// versions. Layer: kernels; called only by tests and benchmarks. Written for
// clarity (double accumulation where it helps), not speed. Thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"

namespace tessera::kernels::reference {

// y[t, r] = Σ_k dequant(W)[r, k] · x[t, k], accumulated in double.
// x: [n_tokens, cols]; y: [n_tokens, rows].
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y);

void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out);
void SwiGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out);
void Softmax(std::span<float> x);

// RoPE computed independently of the fast path: theta_i = pos · base^(-2i/n_dims)
// in double (ggml advances theta by repeated f32 multiplication instead), then
// llama.cpp's YaRN mix and the rotation of the layout, in double.
void Rope(const RopeParams& params, int64_t pos, float* x, int64_t n_heads, int64_t head_dim);

// Naive causal attention of one query at position pos, straight from the layout
// contract in attention.h, in double with a two-pass softmax.
void Attention(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
               int64_t n_heads, int64_t pos, float* out);

}  // namespace tessera::kernels::reference
