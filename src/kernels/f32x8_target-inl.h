// What the per-target f32 kernels (ops_hwy.cc, attention_hwy.cc, rope_hwy.cc) share
// for each Highway target: 8-lane (capped) f32 vectors, so AVX2 and AVX-512 machines
// give the same bits, and the padded load their tails take. Include after highway.h
// (Highway's per-target include guard).
#if defined(TESSERA_KERNELS_F32X8_TARGET_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_KERNELS_F32X8_TARGET_INL_H_
#undef TESSERA_KERNELS_F32X8_TARGET_INL_H_
#else
#define TESSERA_KERNELS_F32X8_TARGET_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 8>;
using VF = hn::Vec<DF>;

// Loads x[0, count) padded with `fill` to a full vector.
HWY_INLINE VF LoadPadded(DF df, const float* x, int64_t count, float fill) {
  HWY_ALIGN float buf[8];
  for (size_t j = 0; j < hn::Lanes(df); ++j) buf[j] = static_cast<int64_t>(j) < count ? x[j] : fill;
  return hn::Load(df, buf);
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::kernels
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
