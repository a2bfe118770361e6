#include "model/gguf.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "model/gguf_internal.h"

namespace tessera::model {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes little-endian");

namespace {

// Nested arrays deeper than this are refused (real files use depth 1).
constexpr int kMaxArrayDepth = 8;
// Longest tensor name ggml accepts (GGML_MAX_NAME is 64 including the NUL).
constexpr uint64_t kMaxTensorNameBytes = 63;

std::string Hex(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, value);
  return buf;
}

}  // namespace

using internal::DecodeScalarBits;
using internal::IsKnownType;
using internal::IsSigned;
using internal::ScalarSize;

// ---------------------------------------------------------------- parser

// Reads the file front to back; every read is bounds-checked and every count is
// checked against the bytes that remain before anything is sized by it.
class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}

  Status Parse(GgufFile& file);

 private:
  Status Error(std::string what) const {
    return InvalidArgumentError("GGUF '" + name_ + "': " + std::move(what));
  }
  Status Truncated(size_t need, std::string_view what) const {
    return Error("truncated file: need " + std::to_string(need) + " bytes at offset " +
                 std::to_string(pos_) + " to read " + std::string(what) + ", but the file has " +
                 std::to_string(bytes_.size()) + " bytes");
  }
  size_t remaining() const { return bytes_.size() - pos_; }

  Status ReadRaw(void* out, size_t n, std::string_view what) {
    if (remaining() < n) return Truncated(n, what);
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  Status ReadU32(uint32_t* out, std::string_view what) { return ReadRaw(out, 4, what); }
  Status ReadU64(uint64_t* out, std::string_view what) { return ReadRaw(out, 8, what); }
  Status ReadString(std::string_view* out, std::string_view what);
  Status ReadValue(GgufType type, GgufValue* out, int depth, const std::string& what);
  Status ReadTensorInfo(GgufTensor* tensor, size_t index);

  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

Status GgufParser::ReadString(std::string_view* out, std::string_view what) {
  uint64_t length = 0;
  TESSERA_RETURN_IF_ERROR(ReadU64(&length, what));
  if (length > remaining()) {
    return Error("string length " + std::to_string(length) + " of " + std::string(what) +
                 " at offset " + std::to_string(pos_ - 8) + " exceeds the " +
                 std::to_string(remaining()) + " bytes left in the file (truncated or corrupt)");
  }
  *out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
  pos_ += length;
  return Status::Ok();
}

Status GgufParser::ReadValue(GgufType type, GgufValue* out, int depth, const std::string& what) {
  out->type_ = type;
  if (type == GgufType::kString) return ReadString(&out->string_, what);
  if (type != GgufType::kArray) {
    size_t size = ScalarSize(type);
    if (remaining() < size) return Truncated(size, what);
    out->bits_ = DecodeScalarBits(type, bytes_.data() + pos_);
    pos_ += size;
    return Status::Ok();
  }
  if (depth >= kMaxArrayDepth) {
    return Error(what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  }
  uint32_t element_type = 0;
  uint64_t count = 0;
  size_t header_offset = pos_;
  TESSERA_RETURN_IF_ERROR(ReadU32(&element_type, what + " (array element type)"));
  if (!IsKnownType(element_type)) {
    return Error(what + ": unknown array element type " + std::to_string(element_type) +
                 " at offset " + std::to_string(header_offset));
  }
  TESSERA_RETURN_IF_ERROR(ReadU64(&count, what + " (array length)"));
  out->array_type_ = static_cast<GgufType>(element_type);
  out->array_size_ = count;
  size_t element_size = ScalarSize(out->array_type_);
  // Strings need at least 8 bytes (their length), arrays 12 (type + length).
  size_t min_element_bytes = element_size                            ? element_size
                             : out->array_type_ == GgufType::kString ? 8
                                                                     : 12;
  if (count > remaining() / min_element_bytes) {
    return Error(what + ": array of " + std::to_string(count) + " " +
                 GgufTypeName(out->array_type_) + " elements at offset " +
                 std::to_string(header_offset) + " cannot fit in the " +
                 std::to_string(remaining()) + " bytes left in the file (truncated or corrupt)");
  }
  if (element_size) {
    out->raw_ = bytes_.subspan(pos_, count * element_size);
    pos_ += count * element_size;
    return Status::Ok();
  }
  if (out->array_type_ == GgufType::kString) {
    out->strings_.resize(count);  // bounded by the check above
    for (uint64_t i = 0; i < count; ++i) {
      // The element's name is spelled out only to report an error: read it again.
      const size_t at = pos_;
      if (ReadString(&out->strings_[i], what).ok()) continue;
      pos_ = at;
      return ReadString(&out->strings_[i], what + "[" + std::to_string(i) + "]");
    }
    return Status::Ok();
  }
  out->elements_.resize(count);  // bounded by the check above
  for (uint64_t i = 0; i < count; ++i) {
    TESSERA_RETURN_IF_ERROR(ReadValue(out->array_type_, &out->elements_[i], depth + 1,
                                      what + "[" + std::to_string(i) + "]"));
  }
  return Status::Ok();
}

Status GgufParser::ReadTensorInfo(GgufTensor* tensor, size_t index) {
  std::string what = "tensor info #" + std::to_string(index);
  TESSERA_RETURN_IF_ERROR(ReadString(&tensor->name, what + " name"));
  if (tensor->name.empty() || tensor->name.size() > kMaxTensorNameBytes) {
    return Error(what + ": name length " + std::to_string(tensor->name.size()) + " is outside 1.." +
                 std::to_string(kMaxTensorNameBytes));
  }
  what = "tensor '" + std::string(tensor->name) + "'";
  uint32_t n_dims = 0;
  TESSERA_RETURN_IF_ERROR(ReadU32(&n_dims, what + " dimension count"));
  if (n_dims < 1 || n_dims > kGgufMaxDims) {
    return Error(what + " has " + std::to_string(n_dims) + " dimensions (1.." +
                 std::to_string(kGgufMaxDims) + " supported)");
  }
  tensor->dims.resize(n_dims);
  int64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t dim = 0;
    TESSERA_RETURN_IF_ERROR(ReadU64(&dim, what + " dims"));
    if (dim < 1 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(what + " has dimension " + std::to_string(d) + " = " + std::to_string(dim));
    }
    int64_t dim_i = static_cast<int64_t>(dim);
    if (elements > std::numeric_limits<int64_t>::max() / dim_i) {
      return Error(what + ": element count of shape overflows 64 bits");
    }
    elements *= dim_i;
    tensor->dims[d] = dim_i;
  }
  tensor->num_elements = elements;
  uint32_t type_id = 0;
  TESSERA_RETURN_IF_ERROR(ReadU32(&type_id, what + " type"));
  std::optional<kernels::WeightType> type = kernels::WeightTypeFromGgmlId(type_id);
  if (!type) {
    return Error(what + " has type " + std::string(kernels::GgmlTypeName(type_id)) + " (ggml id " +
                 std::to_string(type_id) +
                 "), which tessera does not support (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K)");
  }
  tensor->type = *type;
  TESSERA_RETURN_IF_ERROR(ReadU64(&tensor->offset, what + " data offset"));
  const kernels::WeightTypeTraits& traits = kernels::TraitsOf(*type);
  if (tensor->dims[0] % traits.block_elems != 0) {
    return Error(what + " of type " + std::string(traits.name) + " has row length " +
                 std::to_string(tensor->dims[0]) + ", not a multiple of its block size " +
                 std::to_string(traits.block_elems));
  }
  return Status::Ok();
}

Status GgufParser::Parse(GgufFile& file) {
  uint32_t magic = 0;
  TESSERA_RETURN_IF_ERROR(ReadU32(&magic, "the magic number"));
  if (magic != kGgufMagic) {
    return Error("bad magic " + Hex(magic) + " (expected \"GGUF\"): not a GGUF file");
  }
  TESSERA_RETURN_IF_ERROR(ReadU32(&file.version_, "the version"));
  if (file.version_ != 2 && file.version_ != 3) {
    std::string hint = file.version_ == 1 ? " (GGUF v1 is obsolete; re-convert the model)"
                       : (file.version_ & 0xffff) == 0 ? " (a big-endian file?)"
                                                       : "";
    return Error("unsupported GGUF version " + std::to_string(file.version_) +
                 " (2 and 3 are supported)" + hint);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  TESSERA_RETURN_IF_ERROR(ReadU64(&n_tensors, "the tensor count"));
  TESSERA_RETURN_IF_ERROR(ReadU64(&n_kv, "the metadata count"));
  // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
  // 8 + 1 (name) + 4 + 8 + 4 + 8.
  if (n_kv > remaining() / 13) {
    return Error("metadata count " + std::to_string(n_kv) + " cannot fit in the " +
                 std::to_string(remaining()) + " bytes after offset " + std::to_string(pos_) +
                 " (truncated file or corrupt header)");
  }
  if (n_tensors > remaining() / 33) {
    return Error("tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                 std::to_string(remaining()) + " bytes after offset " + std::to_string(pos_) +
                 " (truncated file or corrupt header)");
  }

  file.metadata_.resize(n_kv);
  std::unordered_set<std::string_view> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKeyValue& kv = file.metadata_[i];
    std::string what = "metadata #" + std::to_string(i);
    TESSERA_RETURN_IF_ERROR(ReadString(&kv.key, what + " key"));
    if (!keys.insert(kv.key).second) {
      return Error("duplicate metadata key '" + std::string(kv.key) + "'");
    }
    what = "metadata '" + std::string(kv.key) + "'";
    uint32_t type = 0;
    size_t type_offset = pos_;
    TESSERA_RETURN_IF_ERROR(ReadU32(&type, what + " type"));
    if (!IsKnownType(type)) {
      return Error(what + " has unknown value type " + std::to_string(type) + " at offset " +
                   std::to_string(type_offset));
    }
    TESSERA_RETURN_IF_ERROR(ReadValue(static_cast<GgufType>(type), &kv.value, 0, what));
  }

  if (const GgufValue* align = file.Find("general.alignment")) {
    if (align->type() != GgufType::kU32) {
      return Error("general.alignment has type " + GgufTypeName(align->type()) + " (expected u32)");
    }
    uint64_t a = align->as_u64();
    if (a == 0 || !std::has_single_bit(a) || a > (1u << 30)) {
      return Error("general.alignment " + std::to_string(a) + " is not a power of two");
    }
    file.alignment_ = static_cast<uint32_t>(a);
  }

  file.tensors_.resize(n_tensors);
  std::unordered_set<std::string_view> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TESSERA_RETURN_IF_ERROR(ReadTensorInfo(&file.tensors_[i], i));
    if (!names.insert(file.tensors_[i].name).second) {
      return Error("duplicate tensor name '" + std::string(file.tensors_[i].name) + "'");
    }
  }

  // The data section starts at the next multiple of the alignment.
  size_t align = file.alignment_;
  size_t data_offset = (pos_ + align - 1) / align * align;
  if (n_tensors > 0 && data_offset > bytes_.size()) {
    return Error("truncated file: the data section should start at offset " +
                 std::to_string(data_offset) + " but the file has " +
                 std::to_string(bytes_.size()) + " bytes");
  }
  file.data_offset_ = std::min(data_offset, bytes_.size());
  uint64_t data_size = bytes_.size() - file.data_offset_;

  for (GgufTensor& t : file.tensors_) {
    std::string what = "tensor '" + std::string(t.name) + "'";
    const kernels::WeightTypeTraits& traits = kernels::TraitsOf(t.type);
    // Byte size, overflow-checked: (row blocks * block bytes) * rows.
    uint64_t row_bytes = static_cast<uint64_t>(t.dims[0] / traits.block_elems) *
                         static_cast<uint64_t>(traits.block_bytes);  // < 2^63 * 210 / 32: fits
    if (t.dims[0] / traits.block_elems > std::numeric_limits<int64_t>::max() / traits.block_bytes) {
      return Error(what + ": row size overflows 64 bits");
    }
    uint64_t rows = static_cast<uint64_t>(t.num_elements / t.dims[0]);
    if (rows != 0 && row_bytes > std::numeric_limits<uint64_t>::max() / rows) {
      return Error(what + ": byte size overflows 64 bits");
    }
    uint64_t size = row_bytes * rows;
    if (t.offset % align != 0) {
      return Error(what + " data offset " + std::to_string(t.offset) +
                   " is not a multiple of the alignment " + std::to_string(align));
    }
    if (t.offset > data_size || size > data_size - t.offset) {
      return Error(what + " (" + std::to_string(size) + " bytes at data offset " +
                   std::to_string(t.offset) + ") extends past the end of the file (data section " +
                   std::to_string(data_size) + " bytes)");
    }
    t.data = bytes_.subspan(file.data_offset_ + t.offset, size);
  }

  // No two tensors may share bytes.
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(file.tensors_.size());
  for (const GgufTensor& t : file.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor* prev = by_offset[i - 1];
    const GgufTensor* cur = by_offset[i];
    if (prev->offset + prev->size_bytes() > cur->offset) {
      return Error("tensors '" + std::string(prev->name) + "' (data offset " +
                   std::to_string(prev->offset) + ", " + std::to_string(prev->size_bytes()) +
                   " bytes) and '" + std::string(cur->name) + "' (data offset " +
                   std::to_string(cur->offset) + ") overlap");
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- GgufFile

Result<GgufFile> GgufFile::Open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  GgufFile file;
  file.name_ = path;
  file.mappings_.push_back(std::make_unique<MappedFile>(std::move(mapped)));
  file.bytes_ = file.mappings_.front()->bytes();
  GgufParser parser(file.bytes_, file.name_);
  TESSERA_RETURN_IF_ERROR(parser.Parse(file));
  return file;
}

Result<GgufFile> GgufFile::FromBytes(std::span<const uint8_t> bytes, std::string name) {
  GgufFile file;
  file.name_ = std::move(name);
  file.bytes_ = bytes;
  GgufParser parser(file.bytes_, file.name_);
  TESSERA_RETURN_IF_ERROR(parser.Parse(file));
  return file;
}

Result<GgufFile> GgufFile::Assemble(std::string name, std::string metadata_image,
                                    std::vector<std::unique_ptr<MappedFile>> mappings,
                                    std::vector<AssembledTensor> tensors) {
  GgufFile file;
  file.name_ = std::move(name);
  file.metadata_image_ = std::make_unique<std::string>(std::move(metadata_image));
  file.bytes_ = {reinterpret_cast<const uint8_t*>(file.metadata_image_->data()),
                 file.metadata_image_->size()};
  GgufParser parser(file.bytes_, file.name_);
  TESSERA_RETURN_IF_ERROR(parser.Parse(file));
  if (!file.tensors_.empty()) {
    return InvalidArgumentError("'" + file.name_ + "': the metadata image holds tensors");
  }
  file.mappings_ = std::move(mappings);
  std::unordered_set<std::string_view> names;
  for (AssembledTensor& a : tensors) {
    const std::string what = "'" + file.name_ + "': tensor '" + a.name + "'";
    if (a.dims.empty() || a.dims.size() > static_cast<size_t>(kGgufMaxDims)) {
      return InvalidArgumentError(what + " has " + std::to_string(a.dims.size()) +
                                  " dimensions (1.." + std::to_string(kGgufMaxDims) +
                                  " supported)");
    }
    int64_t elements = 1;
    for (int64_t d : a.dims) {
      if (d < 1 || elements > std::numeric_limits<int64_t>::max() / d) {
        return InvalidArgumentError(what + " has an empty or oversized shape");
      }
      elements *= d;
    }
    const kernels::WeightTypeTraits& traits = kernels::TraitsOf(a.type);
    if (a.dims[0] % traits.block_elems != 0 ||
        elements / traits.block_elems >
            std::numeric_limits<int64_t>::max() / static_cast<int64_t>(traits.block_bytes)) {
      return InvalidArgumentError(what + ": shape does not fit its type");
    }
    const auto size = static_cast<uint64_t>(elements / traits.block_elems * traits.block_bytes);
    if (a.data.size() != size) {
      return InvalidArgumentError(what + " holds " + std::to_string(a.data.size()) +
                                  " bytes, its type and shape need " + std::to_string(size));
    }
    if (size > 0 && file.MappingOf(a.data) == nullptr) {
      return InvalidArgumentError(what + ": its bytes lie outside the model's files");
    }
    file.names_.push_back(std::make_unique<std::string>(std::move(a.name)));
    GgufTensor& t = file.tensors_.emplace_back();
    t.name = *file.names_.back();
    if (!names.insert(t.name).second) {
      return InvalidArgumentError("'" + file.name_ + "': tensor '" + std::string(t.name) +
                                  "' appears twice");
    }
    t.type = a.type;
    t.dims = std::move(a.dims);
    t.num_elements = elements;
    t.data = a.data;
    t.rope_halves_head = a.rope_halves_head;
  }
  return file;
}

const MappedFile* GgufFile::MappingOf(std::span<const uint8_t> bytes) const {
  for (const std::unique_ptr<MappedFile>& m : mappings_) {
    if (bytes.data() >= m->data() && bytes.data() + bytes.size() <= m->data() + m->size_bytes()) {
      return m.get();
    }
  }
  return nullptr;
}

size_t GgufFile::file_bytes() const {
  if (mappings_.empty()) return bytes_.size();
  size_t total = 0;
  for (const std::unique_ptr<MappedFile>& m : mappings_) total += m->size_bytes();
  return total;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t GgufFile::total_tensor_bytes() const {
  size_t total = 0;
  for (const GgufTensor& t : tensors_) total += t.size_bytes();
  return total;
}

}  // namespace tessera::model
