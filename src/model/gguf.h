// GgufFile: a validated, memory-mapped GGUF (v2/v3) model file — metadata
// key/values, tensor infos and views of each tensor's bytes. Layer: model; config.cc,
// tokenizer.cc, the architectures and `tessera inspect` read models through it.
// Immutable after Open; safe to read from many threads. Format notes: docs/gguf.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "kernels/weight_type.h"

namespace tessera::model {

// GGUF metadata value types, numbered as the file format numbers them.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u32", "string", "array", … ; "type 77" for an id outside the enum.
std::string GgufTypeName(GgufType type);

// Fixed GGUF format constants.
inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;

// One metadata value. Strings view the mapped file; numeric arrays keep their raw
// little-endian bytes (read them with the typed getters of GgufFile or the
// *Elements helpers below); string and nested arrays hold one GgufValue per element.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_integer() const;  // u8..i64, not bool
  bool is_float() const { return type_ == GgufType::kF32 || type_ == GgufType::kF64; }

  // Scalars. Each requires the matching kind (CHECKed); use type() first.
  uint64_t as_u64() const;  // unsigned integer types
  int64_t as_i64() const;   // signed integer types
  double as_f64() const;    // f32 / f64
  bool as_bool() const;
  std::string_view as_string() const;

  // Arrays.
  GgufType array_type() const { return array_type_; }
  uint64_t array_size() const { return array_size_; }
  std::span<const uint8_t> array_raw() const { return raw_; }  // numeric element bytes
  // String elements, views into the file (16 bytes each: a vocabulary holds 32k–150k
  // tokens and as many merges).
  std::span<const std::string_view> array_strings() const { return strings_; }
  const std::vector<GgufValue>& array_elements() const { return elements_; }  // arrays

  // A short human-readable rendering ("32000", "[string x 32000]", "\"llama\"").
  std::string Summary() const;

 private:
  friend class GgufParser;
  GgufType type_ = GgufType::kU8;
  uint64_t bits_ = 0;  // integer, bool, or the bit pattern of a double
  std::string_view string_;
  GgufType array_type_ = GgufType::kU8;
  uint64_t array_size_ = 0;
  std::span<const uint8_t> raw_;
  std::vector<std::string_view> strings_;
  std::vector<GgufValue> elements_;
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

// One tensor. dims[0] (ggml's ne[0]) is the innermost dimension: the row length.
struct GgufTensor {
  std::string_view name;
  kernels::WeightType type;
  std::vector<int64_t> dims;      // 1..4 entries, each >= 1
  int64_t num_elements = 0;       // product of dims
  uint64_t offset = 0;            // from the start of the data section
  std::span<const uint8_t> data;  // exactly the tensor's bytes, inside the mapping
  // Non-zero for a query/key projection read from a Hugging Face checkpoint of a
  // llama-layout model: its rows come in heads of this many, each head's in HF's
  // rotate-half order (row i pairs with row i + head/2) where GGUF pairs rows 2i
  // and 2i + 1. The weight binder reorders them (llama_weights.cc); 0: GGUF order.
  int64_t rope_halves_head = 0;

  int64_t row_length() const { return dims[0]; }
  int64_t num_rows() const { return num_elements / dims[0]; }
  size_t size_bytes() const { return data.size(); }
  size_t row_bytes() const { return data.size() / static_cast<size_t>(num_rows()); }
  // "[2048, 32000]" as ggml prints shapes (innermost first).
  std::string ShapeString() const;
};

// A tensor of a model assembled from other files (GgufFile::Assemble).
struct AssembledTensor {
  std::string name;
  kernels::WeightType type = kernels::WeightType::kF32;
  std::vector<int64_t> dims;      // GGUF order: dims[0] innermost
  std::span<const uint8_t> data;  // inside one of the assembled mappings
  int64_t rope_halves_head = 0;   // GgufTensor::rope_halves_head
};

class GgufFile {
 public:
  // Maps and validates `path`. Every error names the file and what is wrong where
  // (magic, version, a truncated field at byte offset X, a tensor past the end, …).
  static Result<GgufFile> Open(const std::string& path);
  // Validates `bytes`, which the caller keeps alive for the GgufFile's lifetime
  // (fuzzing, tests). `name` appears in messages.
  static Result<GgufFile> FromBytes(std::span<const uint8_t> bytes, std::string name);

  // A model whose tensors live in other files (a Hugging Face checkpoint's
  // safetensors, model/hf_checkpoint.h): the metadata parsed from
  // `metadata_image` (a tensor-less GGUF, GgufWriter::MetadataImage), the tensors
  // views of `mappings`. Each tensor is checked: a known shape, its bytes exactly
  // its type's size for that shape and inside one mapping, no name twice.
  static Result<GgufFile> Assemble(std::string name, std::string metadata_image,
                                   std::vector<std::unique_ptr<MappedFile>> mappings,
                                   std::vector<AssembledTensor> tensors);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& name() const { return name_; }  // the path for Open()
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }  // file offset of the data section
  std::span<const uint8_t> bytes() const { return bytes_; }
  // The mapping holding `bytes` whole, or null (FromBytes, or not mapped bytes).
  const MappedFile* MappingOf(std::span<const uint8_t> bytes) const;
  // Bytes of every file behind the model (the GGUF; an assembled model's mappings).
  size_t file_bytes() const;

  // --- metadata ---
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: NotFound when absent, InvalidArgument when the value has another
  // type or does not fit. Integer getters accept any integer type whose value fits.
  Result<std::string_view> GetString(std::string_view key) const;
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<float> GetF32(std::string_view key) const;  // f32 or f64
  Result<bool> GetBool(std::string_view key) const;
  // Same, but `fallback` when the key is absent (a wrong type is still an error).
  Result<int64_t> GetIntOr(std::string_view key, int64_t fallback) const;
  Result<float> GetF32Or(std::string_view key, float fallback) const;
  Result<bool> GetBoolOr(std::string_view key, bool fallback) const;
  Result<std::string_view> GetStringOr(std::string_view key, std::string_view fallback) const;

  Result<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  Result<std::vector<float>> GetF32Array(std::string_view key) const;    // f32/f64 elements
  Result<std::vector<int32_t>> GetI32Array(std::string_view key) const;  // integer elements

  // --- tensors (in file order) ---
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;
  size_t total_tensor_bytes() const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::string name_;
  std::vector<std::unique_ptr<MappedFile>> mappings_;  // one for Open; Assemble's files
  std::unique_ptr<std::string> metadata_image_;        // Assemble: what bytes_ views
  std::vector<std::unique_ptr<std::string>> names_;    // Assemble: the tensors' names
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace tessera::model
