// QuantizeRow against llama.cpp's own output: the stories260K Q8_0 / Q4_0 / F16 files
// in ../shared/models were written by llama-quantize from the f32 files next to them,
// so quantising each f32 row ourselves must reproduce their bytes exactly.
// (A minimal GGUF walker lives here so the kernels tests need no model/ code.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/quantize.h"

namespace tessera::kernels {
namespace {

struct GgufTensor {
  uint32_t type = 0;
  std::vector<uint64_t> dims;
  const uint8_t* data = nullptr;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
    Parse();
  }
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }

 private:
  template <class T>
  T Read() {
    T v;
    EXPECT_LE(pos_ + sizeof(T), bytes_.size());
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string ReadString() {
    const uint64_t n = Read<uint64_t>();
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void SkipValue(uint32_t type) {
    static constexpr size_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      ReadString();
    } else if (type == 9) {
      const uint32_t elem = Read<uint32_t>();
      const uint64_t count = Read<uint64_t>();
      for (uint64_t i = 0; i < count; ++i) SkipValue(elem);
    } else {
      pos_ += kSizes[type];
    }
  }
  void Parse() {
    ASSERT_GE(bytes_.size(), 24u);
    ASSERT_EQ(std::memcmp(bytes_.data(), "GGUF", 4), 0);
    pos_ = 4;
    Read<uint32_t>();  // version
    const uint64_t n_tensors = Read<uint64_t>();
    const uint64_t n_kv = Read<uint64_t>();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = ReadString();
      const uint32_t type = Read<uint32_t>();
      if (key == "general.alignment" && type == 4) {
        alignment = Read<uint32_t>();
      } else {
        SkipValue(type);
      }
    }
    std::vector<std::pair<std::string, uint64_t>> offsets;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const std::string name = ReadString();
      GgufTensor t;
      t.dims.resize(Read<uint32_t>());
      for (auto& d : t.dims) d = Read<uint64_t>();
      t.type = Read<uint32_t>();
      offsets.emplace_back(name, Read<uint64_t>());
      tensors_[name] = t;
    }
    const uint64_t data_start = (pos_ + alignment - 1) / alignment * alignment;
    for (const auto& [name, offset] : offsets)
      tensors_[name].data = bytes_.data() + data_start + offset;
  }

  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
  std::map<std::string, GgufTensor> tensors_;
};

std::string ModelPath(const char* name) {
  return std::string(TESSERA_SHARED_DIR) + "/models/" + name;
}

// Quantises every f32 matrix of `f32_file` and compares with the same tensor of
// `quant_file` where that one has type `type`. Returns the number of rows compared.
int64_t CompareFiles(const char* f32_file, const char* quant_file, WeightType type) {
  if (!std::filesystem::exists(ModelPath(f32_file)) ||
      !std::filesystem::exists(ModelPath(quant_file))) {
    return -1;
  }
  GgufFile src(ModelPath(f32_file)), quant(ModelPath(quant_file));
  int64_t rows_compared = 0;
  for (const auto& [name, q] : quant.tensors()) {
    if (q.type != static_cast<uint32_t>(type)) continue;
    const auto it = src.tensors().find(name);
    if (it == src.tensors().end() || it->second.type != 0) continue;
    const int64_t cols = static_cast<int64_t>(q.dims[0]);
    int64_t rows = 1;
    for (size_t d = 1; d < q.dims.size(); ++d) rows *= static_cast<int64_t>(q.dims[d]);
    const int64_t row_bytes = *RowBytes(type, cols);
    std::vector<uint8_t> ours(row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(type, reinterpret_cast<const float*>(it->second.data) + r * cols, cols,
                  ours.data());
      EXPECT_EQ(std::memcmp(ours.data(), q.data + r * row_bytes, row_bytes), 0)
          << name << " row " << r << " (" << TraitsOf(type).name << ")";
      ++rows_compared;
    }
  }
  return rows_compared;
}

TEST(GgmlGoldenTest, Q8_0MatchesLlamaQuantize) {
  const int64_t rows =
      CompareFiles("stories260K-ffn192.gguf", "stories260K-ffn192-Q8_0.gguf", WeightType::kQ8_0);
  if (rows < 0) GTEST_SKIP() << "shared models not present";
  EXPECT_GT(rows, 1000);
}

TEST(GgmlGoldenTest, Q4_0MatchesLlamaQuantize) {
  const int64_t rows =
      CompareFiles("stories260K-ffn192.gguf", "stories260K-ffn192-Q4_0.gguf", WeightType::kQ4_0);
  if (rows < 0) GTEST_SKIP() << "shared models not present";
  EXPECT_GT(rows, 1000);
}

TEST(GgmlGoldenTest, F16MatchesLlamaQuantize) {
  const int64_t rows = CompareFiles("stories260K.gguf", "stories260K-F16.gguf", WeightType::kF16);
  if (rows < 0) GTEST_SKIP() << "shared models not present";
  EXPECT_GT(rows, 1000);
}

}  // namespace
}  // namespace tessera::kernels
