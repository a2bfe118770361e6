// Helpers for the model tests: temp paths, whole-file reads, and a tiny valid GGUF
// (written with GgufWriter) to mutate in the bad-file tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf_writer.h"

namespace tessera::model::testing {

// A directory of this process's temp files (ctest runs every test case as its own
// process, in parallel), removed with what it holds when the process exits.
class ProcessTempDir {
 public:
  ProcessTempDir()
      : owner_(::getpid()),
        path_(::testing::TempDir() + "/tessera_model_" + std::to_string(owner_)) {
    std::filesystem::create_directories(path_);
  }
  ~ProcessTempDir() {
    if (::getpid() != owner_) return;  // a death test's child leaves it to its parent
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ProcessTempDir(const ProcessTempDir&) = delete;
  ProcessTempDir& operator=(const ProcessTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  pid_t owner_;
  std::string path_;
};

// A path for a temp file `name`, in this process's ProcessTempDir.
inline std::string TempPath(const std::string& name) {
  static ProcessTempDir dir;
  return dir.path() + "/" + name;
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Appends little-endian fields, to hand-craft GGUF bytes.
struct ByteBuilder {
  std::vector<uint8_t> bytes;
  template <typename T>
  void Put(T value) {
    size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &value, sizeof(T));
  }
  void U32(uint32_t v) { Put(v); }
  void U64(uint64_t v) { Put(v); }
  void Str(std::string_view s) {  // GGUF string: u64 length + bytes
    U64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
};

// A small GGUF: a few metadata values and two f32 tensors "a" [4, 2] (values 0..7)
// and "b" [3] (values 100..102).
inline std::vector<uint8_t> SmallGguf() {
  std::string path = TempPath("small.gguf");
  GgufWriter w;
  w.SetString("general.architecture", "test");
  w.SetU32("test.count", 7);
  std::vector<float> f = {1.5f, -2.0f};
  w.SetF32Array("test.floats", f);
  EXPECT_TRUE(w.AddTensor("a", kernels::WeightType::kF32, {4, 2}).ok());
  EXPECT_TRUE(w.AddTensor("b", kernels::WeightType::kF32, {3}).ok());
  EXPECT_TRUE(w.Open(path).ok());
  float a[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  float b[3] = {100, 101, 102};
  EXPECT_TRUE(w.Append({reinterpret_cast<const uint8_t*>(a), sizeof(a)}).ok());
  EXPECT_TRUE(w.Append({reinterpret_cast<const uint8_t*>(b), sizeof(b)}).ok());
  EXPECT_TRUE(w.Close().ok());
  std::vector<uint8_t> bytes = ReadBytes(path);
  std::remove(path.c_str());
  return bytes;
}

}  // namespace tessera::model::testing
