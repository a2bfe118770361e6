// SafetensorsFile: a validated, memory-mapped .safetensors file (Hugging Face's
// weight format: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data). Only the header is
// read when opening; tensor bytes stay in the mapping until someone reads them.
// WriteSafetensors writes one (tests, `tessera synth --format safetensors`).
// Layer: model; hf_checkpoint.cc reads checkpoints through it. Immutable after
// Open; safe to read from many threads. Format notes: docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"

namespace tessera::model {

// Largest header accepted (the format's own readers refuse over 100 MB too).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;              // as stored: "F32", "F16", "BF16", "I64", …
  std::vector<int64_t> shape;     // row-major: shape.back() is the innermost dimension
  int64_t num_elements = 1;       // product of shape (1 for a scalar)
  std::span<const uint8_t> data;  // exactly the tensor's bytes, inside the file
};

// Bytes of one element of `dtype`, or 0 for a dtype the format does not define.
int SafetensorsDtypeBytes(std::string_view dtype);

class SafetensorsFile {
 public:
  // Maps and validates `path`. Every error names the file and the problem: header
  // length past the end, header not JSON (with the byte), an entry without dtype,
  // shape or data_offsets, an unknown dtype, a byte range outside the data or of the
  // wrong size for its dtype and shape, two tensors sharing bytes.
  static Result<SafetensorsFile> Open(const std::string& path);
  // Validates `bytes`, which the caller keeps alive (tests). `name` is for messages.
  static Result<SafetensorsFile> FromBytes(std::span<const uint8_t> bytes, std::string name);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& name() const { return name_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // by offset
  const SafetensorsTensor* Find(std::string_view name) const;
  // The mapping (null for FromBytes); moving it out keeps the views valid.
  std::unique_ptr<MappedFile> TakeMapping() { return std::move(mapping_); }

 private:
  SafetensorsFile() = default;
  Status Parse(std::span<const uint8_t> bytes);

  std::string name_;
  std::unique_ptr<MappedFile> mapping_;
  std::vector<SafetensorsTensor> tensors_;
};

// One tensor to write: its bytes come from `fill` (called once, in order), which
// must append exactly num_elements × dtype bytes to its argument.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::function<Status(std::string*)> fill;
};

// Writes `entries` to `path` (header padded to 8 bytes, data in entry order).
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries);

}  // namespace tessera::model
