#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "base/check.h"
#include "base/half.h"
#include "kernels/reference/reference.h"

namespace tessera::kernels::reference {

void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + eps);
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i] * scale * weight[i]);
}

void SwiGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out) {
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void Softmax(std::span<float> x) {
  double max = -std::numeric_limits<double>::infinity();
  for (float v : x) max = std::max<double>(max, v);
  if (max == -std::numeric_limits<double>::infinity()) {
    std::fill(x.begin(), x.end(), 0.0f);
    return;
  }
  double sum = 0;
  for (float v : x) sum += std::exp(v - max);
  for (float& v : x) v = static_cast<float>(std::exp(v - max) / sum);
}

void Rope(const RopeParams& p, int64_t pos, float* x, int64_t n_heads, int64_t head_dim) {
  const int half = p.n_dims / 2;
  double low = 0, high = 0;
  if (p.ext_factor != 0) {
    auto corr_dim = [&](double n_rot) {
      return p.n_dims * std::log(p.n_ctx_orig / (n_rot * 2 * std::numbers::pi)) /
             (2 * std::log(static_cast<double>(p.freq_base)));
    };
    low = std::max(0.0, std::floor(corr_dim(p.beta_fast)));
    high = std::min(p.n_dims - 1.0, std::ceil(corr_dim(p.beta_slow)));
  }
  for (int i = 0; i < half; ++i) {
    double theta_extrap = pos * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
    if (!p.freq_factors.empty()) theta_extrap /= p.freq_factors[i];
    double theta = p.freq_scale * theta_extrap;
    double mscale = p.attn_factor;
    if (p.ext_factor != 0) {
      const double y = (i - low) / std::max(0.001, high - low);
      const double ramp = (1 - std::min(1.0, std::max(0.0, y))) * p.ext_factor;
      theta = theta * (1 - ramp) + theta_extrap * ramp;
      mscale *= 1 + 0.1 * std::log(1.0 / p.freq_scale);
    }
    const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      const int64_t i0 = p.layout == RopeLayout::kNeox ? i : 2 * i;
      const int64_t i1 = p.layout == RopeLayout::kNeox ? i + half : 2 * i + 1;
      const double x0 = xh[i0], x1 = xh[i1];
      xh[i0] = static_cast<float>(x0 * c - x1 * s);
      xh[i1] = static_cast<float>(x0 * s + x1 * c);
    }
  }
}

void Attention(const PagedKv& kv, std::span<const int32_t> block_table, const float* q,
               int64_t n_heads, int64_t pos, float* out) {
  const KvLayout& l = kv.layout;
  const int64_t group = n_heads / l.n_kv_heads;
  auto element = [&](const void* pool, int64_t p, int64_t h, int64_t d) -> double {
    const int64_t block = block_table[p / l.block_size];
    const int64_t index =
        block * l.BlockStride() + (h * l.block_size + p % l.block_size) * l.head_dim + d;
    if (l.type == KvType::kF32) return static_cast<const float*>(pool)[index];
    return F16ToF32(static_cast<const uint16_t*>(pool)[index]);
  };
  std::vector<double> scores(pos + 1);
  for (int64_t head = 0; head < n_heads; ++head) {
    const int64_t h = head / group;
    const float* qh = q + head * l.head_dim;
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t p = 0; p <= pos; ++p) {
      double dot = 0;
      for (int64_t d = 0; d < l.head_dim; ++d) dot += qh[d] * element(kv.k, p, h, d);
      scores[p] = dot / std::sqrt(static_cast<double>(l.head_dim));
      max = std::max(max, scores[p]);
    }
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - max));
    for (int64_t d = 0; d < l.head_dim; ++d) {
      double acc = 0;
      for (int64_t p = 0; p <= pos; ++p) acc += scores[p] * element(kv.v, p, h, d);
      out[head * l.head_dim + d] = static_cast<float>(acc / sum);
    }
  }
}

}  // namespace tessera::kernels::reference
