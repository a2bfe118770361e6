// Element-wise and row kernels on f32 spans: RMSNorm, SwiGLU, softmax, add/scale
// helpers, dot, argmax. Highway runtime dispatch; scalar oracles in
// reference/reference.h. Layer: kernels; called by model/ and engine/.
// Every kernel is a pure function of its inputs (fixed reduction order: 8-lane
// accumulators, then a fixed lane tree), so rows are batch-invariant. Thread-safe.
// Outputs may alias inputs exactly (same pointer), never partially.
#pragma once

#include <cstdint>
#include <span>

namespace tessera::kernels {

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]. Sizes must match.
void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void SwiGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out);

// In place: x[i] = exp(x[i] - max) / Σ exp(x[j] - max). -inf entries become 0.
void Softmax(std::span<float> x);

// out[i] = a[i] + b[i].
void Add(std::span<const float> a, std::span<const float> b, std::span<float> out);

// x[i] *= s.
void Scale(std::span<float> x, float s);

// y[i] += s * x[i].
void ScaleAdd(float s, std::span<const float> x, std::span<float> y);

// Σ a[i]·b[i] (8-lane accumulation, fixed order).
float Dot(std::span<const float> a, std::span<const float> b);

// Index of the largest element (the first one on ties; NaN never wins). -1 if empty.
int64_t Argmax(std::span<const float> x);

}  // namespace tessera::kernels
