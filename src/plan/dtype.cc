#include "plan/dtype.h"

#include <array>
#include <cctype>

namespace tessera::plan {
namespace {

struct DTypeRow {
  std::string_view name;
  int64_t block_elems;
  int64_t block_bytes;
};

// GGML block geometry for the quantised formats (ggml-common.h).
// mxfp8: the OCP microscaling format, 32 e4m3 elements and one E8M0 scale byte.
constexpr std::array<DTypeRow, 10> kDTypes = {{
    {"f32", 1, 4},
    {"f16", 1, 2},
    {"bf16", 1, 2},
    {"fp8", 1, 1},
    {"mxfp8", 32, 33},
    {"i32", 1, 4},
    {"q8_0", 32, 34},
    {"q4_0", 32, 18},
    {"q4_k", 256, 144},
    {"q6_k", 256, 210},
}};

}  // namespace

int64_t DType::BytesOf(int64_t num_elems) const {
  return (num_elems + block_elems - 1) / block_elems * block_bytes;
}

Result<DType> ParseDType(std::string_view name) {
  std::string lower(name);  // llama.cpp spells "q4_K"
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const DTypeRow& row : kDTypes) {
    if (row.name == lower) return DType{std::string(row.name), row.block_elems, row.block_bytes};
  }
  std::string known;
  for (const DTypeRow& row : kDTypes) known += (known.empty() ? "" : ", ") + std::string(row.name);
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> KnownDTypeNames() {
  std::vector<std::string> names;
  for (const DTypeRow& row : kDTypes) names.emplace_back(row.name);
  return names;
}

}  // namespace tessera::plan
