#include "kernels/weight_type.h"

#include "base/check.h"

namespace tessera::kernels {
namespace {

constexpr WeightTypeTraits kTraits[] = {
    {WeightType::kF32, "f32", 1, 4},       {WeightType::kF16, "f16", 1, 2},
    {WeightType::kQ4_0, "q4_0", 32, 18},   {WeightType::kQ8_0, "q8_0", 32, 34},
    {WeightType::kQ4_K, "q4_K", 256, 144}, {WeightType::kQ6_K, "q6_K", 256, 210},
    {WeightType::kBF16, "bf16", 1, 2},
};

}  // namespace

const WeightTypeTraits& TraitsOf(WeightType type) {
  for (const auto& traits : kTraits) {
    if (traits.type == type) return traits;
  }
  TESSERA_CHECK(false) << "unknown WeightType " << static_cast<uint32_t>(type);
  return kTraits[0];
}

std::optional<WeightType> WeightTypeFromGgmlId(uint32_t ggml_id) {
  for (const auto& traits : kTraits) {
    if (static_cast<uint32_t>(traits.type) == ggml_id) return traits.type;
  }
  return std::nullopt;
}

std::string_view GgmlTypeName(uint32_t ggml_id) {
  static constexpr std::string_view kNames[] = {
      "f32",      "f16",      "q4_0",    "q4_1",  "q4_2",   "q4_3",  "q5_0",  "q5_1",
      "q8_0",     "q8_1",     "q2_K",    "q3_K",  "q4_K",   "q5_K",  "q6_K",  "q8_K",
      "iq2_xxs",  "iq2_xs",   "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
      "i8",       "i16",      "i32",     "i64",   "f64",    "iq1_m", "bf16",  "q4_0_4_4",
      "q4_0_4_8", "q4_0_8_8", "tq1_0",   "tq2_0"};
  if (ggml_id < std::size(kNames)) return kNames[ggml_id];
  return "unknown";
}

std::optional<int64_t> RowBytes(WeightType type, int64_t elems) {
  const WeightTypeTraits& traits = TraitsOf(type);
  if (elems < 0 || elems % traits.block_elems != 0) return std::nullopt;
  return elems / traits.block_elems * traits.block_bytes;
}

}  // namespace tessera::kernels
