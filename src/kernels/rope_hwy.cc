// RoPE: the (cos, sin) table in scalar f32 as ggml computes it, the rotation with
// 8-lane Highway vectors (NeoX: contiguous halves; normal: pairs via Reverse2).
#include <algorithm>
#include <cmath>
#include <numbers>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rope_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "base/check.h"
#include "kernels/f32x8_target-inl.h"
#include "kernels/rope.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {

// cos/sin: n_dims/2 entries each.
void RopeRotateImpl(int layout, const float* cos, const float* sin, float* x, int64_t n_heads,
                    int64_t head_dim, int64_t n_dims) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = n_dims / 2;
  if (layout == static_cast<int>(RopeLayout::kNeox)) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      int64_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const VF x0 = hn::LoadU(df, xh + i), x1 = hn::LoadU(df, xh + half + i);
        const VF c = hn::LoadU(df, cos + i), s = hn::LoadU(df, sin + i);
        hn::StoreU(hn::MulSub(x0, c, hn::Mul(x1, s)), df, xh + i);
        hn::StoreU(hn::MulAdd(x0, s, hn::Mul(x1, c)), df, xh + half + i);
      }
      for (; i < half; ++i) {
        const float x0 = xh[i], x1 = xh[half + i];
        xh[i] = x0 * cos[i] - x1 * sin[i];
        xh[half + i] = x0 * sin[i] + x1 * cos[i];
      }
    }
    return;
  }
  // Normal layout: out = x * [c, c] + swap_pairs(x) * [-s, s].
  HWY_ALIGN float cos2[512];
  HWY_ALIGN float sin2[512];
  TESSERA_CHECK_LE(n_dims, 512);
  for (int64_t i = 0; i < half; ++i) {
    cos2[2 * i] = cos2[2 * i + 1] = cos[i];
    sin2[2 * i] = -sin[i];
    sin2[2 * i + 1] = sin[i];
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    int64_t i = 0;
    if (lanes % 2 == 0) {
      for (; i + lanes <= n_dims; i += lanes) {
        const VF v = hn::LoadU(df, xh + i);
        const VF swapped = hn::Reverse2(df, v);
        hn::StoreU(hn::MulAdd(v, hn::Load(df, cos2 + i), hn::Mul(swapped, hn::Load(df, sin2 + i))),
                   df, xh + i);
      }
    }
    for (; i < n_dims; i += 2) {
      const float x0 = xh[i], x1 = xh[i + 1];
      xh[i] = x0 * cos2[i] - x1 * sin[i / 2];
      xh[i + 1] = x0 * sin[i / 2] + x1 * cos2[i];
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {
namespace {

// ggml_rope_yarn_corr_dim: the dimension whose wavelength spans n_rot rotations
// over the original context.
float YarnCorrDim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2 * std::numbers::pi_v<float>)) /
         (2 * std::log(base));
}

float YarnRamp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

HWY_EXPORT(RopeRotateImpl);

void RopeCosSin(const RopeParams& p, int64_t pos, float* cos, float* sin) {
  TESSERA_CHECK(p.n_dims > 0 && p.n_dims % 2 == 0) << p.n_dims;
  TESSERA_CHECK(p.freq_factors.empty() ||
                static_cast<int64_t>(p.freq_factors.size()) >= p.n_dims / 2);
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  float corr_low = 0, corr_high = 0;
  if (p.ext_factor != 0.0f) {
    const float start = std::floor(YarnCorrDim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base));
    const float end = std::ceil(YarnCorrDim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base));
    corr_low = std::max(0.0f, start);
    corr_high = std::min(static_cast<float>(p.n_dims - 1), end);
  }
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float ff = p.freq_factors.empty() ? 1.0f : p.freq_factors[i0 / 2];
    const float theta_extrap = theta / ff;
    const float theta_interp = p.freq_scale * theta_extrap;
    float th = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = YarnRamp(corr_low, corr_high, i0) * p.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cos[i0 / 2] = std::cos(th) * mscale;
    sin[i0 / 2] = std::sin(th) * mscale;
    theta *= theta_scale;
  }
}

void Rope(const RopeParams& params, int64_t pos, float* x, int64_t n_heads, int64_t head_dim) {
  TESSERA_CHECK(params.n_dims <= head_dim && params.n_dims <= 512)
      << params.n_dims << " vs head_dim " << head_dim;
  float cos[256], sin[256];
  RopeCosSin(params, pos, cos, sin);
  HWY_DYNAMIC_DISPATCH(RopeRotateImpl)
  (static_cast<int>(params.layout), cos, sin, x, n_heads, head_dim, params.n_dims);
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
