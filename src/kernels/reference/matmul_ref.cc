#include <vector>

#include "kernels/quantize.h"
#include "kernels/reference/reference.h"

namespace tessera::kernels::reference {

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, w.data + r * w.row_bytes, w.cols, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < w.cols; ++k) sum += static_cast<double>(row[k]) * x[t * w.cols + k];
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace tessera::kernels::reference
