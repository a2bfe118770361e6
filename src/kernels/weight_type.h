// WeightType: the element/block formats tessera computes with, numbered as GGML
// numbers them (so GGUF type ids map one-to-one), with each format's block
// geometry. Layer: kernels; model/ validates GGUF tensors against this table.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera::kernels {

enum class WeightType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30,
};

struct WeightTypeTraits {
  WeightType type;
  std::string_view name;  // "q8_0", as llama.cpp prints it
  int64_t block_elems;    // elements per block (1 for plain floats)
  int64_t block_bytes;    // bytes per block
};

// Traits of a supported type.
const WeightTypeTraits& TraitsOf(WeightType type);

// The supported type with this GGML id, or nullopt (a GGUF tensor of another
// type is an error naming the tensor and the type).
std::optional<WeightType> WeightTypeFromGgmlId(uint32_t ggml_id);

// GGML's name for any type id, supported or not ("q5_k", "iq2_xs", …), for messages.
std::string_view GgmlTypeName(uint32_t ggml_id);

// Bytes of one row of `elems` elements; nullopt if elems is not a whole number of blocks.
std::optional<int64_t> RowBytes(WeightType type, int64_t elems);

}  // namespace tessera::kernels
