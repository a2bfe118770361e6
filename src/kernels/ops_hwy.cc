// Per-target bodies of the kernels in ops.h. All use 8-lane (capped) vectors so
// AVX2 and AVX-512 machines produce the same bits; tails run as one zero-padded
// (or neutral-padded) vector step.
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ops_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h:
#include "base/check.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/f32x8_target-inl.h"
#include "kernels/ops.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE void StorePartial(DF df, VF v, int64_t count, float* out) {
  HWY_ALIGN float buf[8];
  hn::Store(v, df, buf);
  for (int64_t j = 0; j < count; ++j) out[j] = buf[j];
}

// Applies fn(vector_index_offset, count) over [0, n) in full vectors then one tail.
template <class Body, class Tail>
HWY_INLINE void ForVectors(DF df, int64_t n, Body body, Tail tail) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(i);
  if (i < n) tail(i, n - i);
}

float DotImpl(const float* a, const float* b, int64_t n) {
  const DF df;
  VF acc = hn::Zero(df);
  ForVectors(
      df, n, [&](int64_t i) { acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc); },
      [&](int64_t i, int64_t c) {
        acc = hn::MulAdd(LoadPadded(df, a + i, c, 0.0f), LoadPadded(df, b + i, c, 0.0f), acc);
      });
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

void RmsNormImpl(const float* x, const float* weight, float eps, int64_t n, float* out) {
  const DF df;
  const float mean = DotImpl(x, x, n) / static_cast<float>(n);
  const VF scale = hn::Set(df, 1.0f / std::sqrt(mean + eps));
  ForVectors(
      df, n,
      [&](int64_t i) {
        hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), scale), hn::LoadU(df, weight + i)), df,
                   out + i);
      },
      [&](int64_t i, int64_t c) {
        const VF v =
            hn::Mul(hn::Mul(LoadPadded(df, x + i, c, 0), scale), LoadPadded(df, weight + i, c, 0));
        StorePartial(df, v, c, out + i);
      });
}

HWY_INLINE VF Silu(DF df, VF g) {
  // exp(-g) overflows past 88; clamping there changes silu by < 1e-36.
  const VF e = hn::Exp(df, hn::Min(hn::Neg(g), hn::Set(df, 88.0f)));
  return hn::Div(g, hn::Add(hn::Set(df, 1.0f), e));
}

void SwiGluImpl(const float* gate, const float* up, int64_t n, float* out) {
  const DF df;
  ForVectors(
      df, n,
      [&](int64_t i) {
        hn::StoreU(hn::Mul(Silu(df, hn::LoadU(df, gate + i)), hn::LoadU(df, up + i)), df, out + i);
      },
      [&](int64_t i, int64_t c) {
        const VF v =
            hn::Mul(Silu(df, LoadPadded(df, gate + i, c, 0)), LoadPadded(df, up + i, c, 0));
        StorePartial(df, v, c, out + i);
      });
}

void SoftmaxImpl(float* x, int64_t n) {
  const DF df;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Set(df, kNegInf);
  ForVectors(
      df, n, [&](int64_t i) { vmax = hn::Max(vmax, hn::LoadU(df, x + i)); },
      [&](int64_t i, int64_t c) { vmax = hn::Max(vmax, LoadPadded(df, x + i, c, kNegInf)); });
  const float max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (max == kNegInf) {  // all masked: define as uniform zeros rather than NaN
    for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
    return;
  }
  const VF vm = hn::Set(df, max);
  VF sum = hn::Zero(df);
  ForVectors(
      df, n,
      [&](int64_t i) {
        const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vm));
        sum = hn::Add(sum, e);
        hn::StoreU(e, df, x + i);
      },
      [&](int64_t i, int64_t c) {
        const VF e = hn::Exp(df, hn::Sub(LoadPadded(df, x + i, c, kNegInf), vm));
        sum = hn::Add(sum, e);
        StorePartial(df, e, c, x + i);
      });
  const VF inv = hn::Set(df, 1.0f / hn::GetLane(hn::SumOfLanes(df, sum)));
  ForVectors(
      df, n, [&](int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(df, x + i), inv), df, x + i); },
      [&](int64_t i, int64_t c) {
        StorePartial(df, hn::Mul(LoadPadded(df, x + i, c, 0), inv), c, x + i);
      });
}

void AddImpl(const float* a, const float* b, int64_t n, float* out) {
  const DF df;
  ForVectors(
      df, n,
      [&](int64_t i) {
        hn::StoreU(hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i)), df, out + i);
      },
      [&](int64_t i, int64_t c) {
        for (int64_t j = 0; j < c; ++j) out[i + j] = a[i + j] + b[i + j];
      });
}

void ScaleImpl(float* x, int64_t n, float s) {
  const DF df;
  const VF vs = hn::Set(df, s);
  ForVectors(
      df, n, [&](int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(df, x + i), vs), df, x + i); },
      [&](int64_t i, int64_t c) {
        for (int64_t j = 0; j < c; ++j) x[i + j] *= s;
      });
}

void ScaleAddImpl(float s, const float* x, int64_t n, float* y) {
  const DF df;
  const VF vs = hn::Set(df, s);
  ForVectors(
      df, n,
      [&](int64_t i) {
        hn::StoreU(hn::MulAdd(vs, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
      },
      [&](int64_t i, int64_t c) {
        StorePartial(df, hn::MulAdd(vs, LoadPadded(df, x + i, c, 0), LoadPadded(df, y + i, c, 0)),
                     c, y + i);
      });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::kernels {

HWY_EXPORT(DotImpl);
HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(SwiGluImpl);
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(AddImpl);
HWY_EXPORT(ScaleImpl);
HWY_EXPORT(ScaleAddImpl);

void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out) {
  TESSERA_CHECK(x.size() == weight.size() && x.size() == out.size() && !x.empty());
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x.data(), weight.data(), eps, x.size(), out.data());
}

void SwiGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out) {
  TESSERA_CHECK(gate.size() == up.size() && gate.size() == out.size());
  HWY_DYNAMIC_DISPATCH(SwiGluImpl)(gate.data(), up.data(), gate.size(), out.data());
}

void Softmax(std::span<float> x) {
  if (x.empty()) return;
  HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x.data(), x.size());
}

void Add(std::span<const float> a, std::span<const float> b, std::span<float> out) {
  TESSERA_CHECK(a.size() == b.size() && a.size() == out.size());
  HWY_DYNAMIC_DISPATCH(AddImpl)(a.data(), b.data(), a.size(), out.data());
}

void Scale(std::span<float> x, float s) { HWY_DYNAMIC_DISPATCH(ScaleImpl)(x.data(), x.size(), s); }

void ScaleAdd(float s, std::span<const float> x, std::span<float> y) {
  TESSERA_CHECK_EQ(x.size(), y.size());
  HWY_DYNAMIC_DISPATCH(ScaleAddImpl)(s, x.data(), x.size(), y.data());
}

float Dot(std::span<const float> a, std::span<const float> b) {
  TESSERA_CHECK_EQ(a.size(), b.size());
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a.data(), b.data(), a.size());
}

int64_t Argmax(std::span<const float> x) {
  // A single pass of compares is memory-bound already; kept scalar so ties and NaN
  // have one obvious rule.
  int64_t best = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = static_cast<int64_t>(i);
  }
  return best;
}

}  // namespace tessera::kernels
#endif  // HWY_ONCE
