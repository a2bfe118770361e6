// FoldAttentionSpan: the one merge of two softmax partials, for every target.
//
// Its own file, compiled without any target's flags and with -ffp-contract=off
// (src/kernels/CMakeLists.txt): defined beside the per-target kernels, GCC inlines it
// into the AVX2/AVX-512 copies and fuses `out * a + span_out * b` into an FMA there
// but not in the baseline copy — the kernel's fold and a context-parallel rank's fold
// of the same partials then differ in the last bit.

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"

namespace tessera::kernels {

void FoldAttentionSpan(float& max, float& sum, float* out, float span_max, float span_sum,
                       const float* span_out, int64_t n) {
  const float new_max = std::max(max, span_max);
  const float a = std::exp(max - new_max), b = std::exp(span_max - new_max);
  sum = sum * a + span_sum * b;
  for (int64_t d = 0; d < n; ++d) out[d] = out[d] * a + span_out[d] * b;
  max = new_max;
}

}  // namespace tessera::kernels
