// Scalar reference implementations of every kernel: the test oracles for the SIMD
// versions. Layer: kernels; called only by tests and benchmarks. Written for
// clarity (double accumulation where it helps), not speed. Thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/matmul.h"

namespace tessera::kernels::reference {

// y[t, r] = Σ_k dequant(W)[r, k] · x[t, k], accumulated in double.
// x: [n_tokens, cols]; y: [n_tokens, rows].
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace tessera::kernels::reference
