// GgufWriter: writes a GGUF v3 file — metadata, tensor infos, then tensor data
// streamed to disk in declaration order (a model never has to fit in memory).
// Layer: model; used by `tessera synth` (synth.cc), tests and the fuzz seed corpus.
// Not thread-safe; one writer per file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/weight_type.h"
#include "model/gguf.h"

namespace tessera::model {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = kGgufDefaultAlignment);
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;
  ~GgufWriter();  // closes (without the completeness check) if still open

  // Metadata, in the order first set; setting a key again replaces its value.
  // Must precede Open().
  void SetU32(std::string_view key, uint32_t value);
  void SetI32(std::string_view key, int32_t value);
  void SetU64(std::string_view key, uint64_t value);
  void SetF32(std::string_view key, float value);
  void SetBool(std::string_view key, bool value);
  void SetString(std::string_view key, std::string_view value);
  void SetStringArray(std::string_view key, std::span<const std::string> values);
  void SetF32Array(std::string_view key, std::span<const float> values);
  void SetI32Array(std::string_view key, std::span<const int32_t> values);
  // A value read from another GGUF (any type, nested arrays included).
  void SetValue(std::string_view key, const GgufValue& value);

  // Declares a tensor (dims innermost first). InvalidArgument if the shape is not
  // whole blocks of `type`, a dim is < 1, the size overflows, or the name repeats.
  Status AddTensor(std::string_view name, kernels::WeightType type, std::vector<int64_t> dims);
  // Bytes the tensor with this declaration index occupies.
  uint64_t tensor_size_bytes(size_t index) const { return tensors_[index].size_bytes; }
  size_t num_tensors() const { return tensors_.size(); }

  // Creates `path` and writes the header, metadata and tensor infos.
  Status Open(const std::string& path);
  // The header and metadata of a GGUF with no tensors, in memory (the metadata
  // image GgufFile::Assemble parses). The declared tensors are left out.
  std::string MetadataImage() const;
  // Appends data of the current tensor (declaration order); a call may cover part of
  // a tensor or run across several. Padding between tensors is written for you.
  Status Append(std::span<const uint8_t> bytes);
  // Checks every tensor's data was written, flushes and closes. The file is whole
  // only if this returns OK.
  Status Close();

 private:
  struct TensorDecl {
    std::string name;
    kernels::WeightType type;
    std::vector<int64_t> dims;
    uint64_t offset;
    uint64_t size_bytes;
  };
  void SetRaw(std::string_view key, GgufType type, std::string payload);
  std::string Header(bool with_tensors) const;
  Status WriteBytes(const void* data, size_t size);
  Status WritePadding();

  uint32_t alignment_;
  std::vector<std::pair<std::string, std::string>> metadata_;  // key -> type + payload
  std::vector<TensorDecl> tensors_;
  uint64_t data_size_ = 0;  // end of the last declared tensor (unpadded)
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;       // bytes written to the file so far
  size_t current_ = 0;         // tensor being appended
  uint64_t current_done_ = 0;  // bytes of it written
};

}  // namespace tessera::model
