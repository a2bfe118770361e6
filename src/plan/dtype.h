// DType: the element formats the planner sizes weights, KV cache and activations
// in, with quantisation block overhead (q8_0 stores 32 elements in 34 bytes).
// Layer: plan (pure data). Used by the cost model and the `tessera plan` flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::plan {

struct DType {
  std::string name;         // "bf16", "q8_0", as llama.cpp prints it
  int64_t block_elems = 1;  // elements per block (1 for plain numbers)
  int64_t block_bytes = 4;  // bytes per block

  // Bytes of `num_elems` elements, whole blocks (a partial block costs a block).
  int64_t BytesOf(int64_t num_elems) const;
  double bytes_per_elem() const { return static_cast<double>(block_bytes) / block_elems; }
  bool quantized() const { return block_elems > 1; }
};

// f32, f16, bf16, fp8, i32, q8_0, q4_0, q4_k, q6_k; InvalidArgument naming the
// known names otherwise.
Result<DType> ParseDType(std::string_view name);
std::vector<std::string> KnownDTypeNames();

}  // namespace tessera::plan
