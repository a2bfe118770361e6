#include "model/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

namespace tessera::model {
namespace {

template <typename T>
void Put(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

// The payload of `value` (everything after its type tag).
void PutValuePayload(std::string* out, const GgufValue& value) {
  switch (value.type()) {
    case GgufType::kString:
      PutString(out, value.as_string());
      return;
    case GgufType::kArray:
      Put<uint32_t>(out, static_cast<uint32_t>(value.array_type()));
      Put<uint64_t>(out, value.array_size());
      if (value.array_type() == GgufType::kString) {
        for (std::string_view e : value.array_strings()) PutString(out, e);
      } else if (value.array_type() == GgufType::kArray) {
        for (const GgufValue& e : value.array_elements()) PutValuePayload(out, e);
      } else {
        out->append(reinterpret_cast<const char*>(value.array_raw().data()),
                    value.array_raw().size());
      }
      return;
    case GgufType::kU8:
      Put<uint8_t>(out, static_cast<uint8_t>(value.as_u64()));
      return;
    case GgufType::kI8:
      Put<int8_t>(out, static_cast<int8_t>(value.as_i64()));
      return;
    case GgufType::kU16:
      Put<uint16_t>(out, static_cast<uint16_t>(value.as_u64()));
      return;
    case GgufType::kI16:
      Put<int16_t>(out, static_cast<int16_t>(value.as_i64()));
      return;
    case GgufType::kU32:
      Put<uint32_t>(out, static_cast<uint32_t>(value.as_u64()));
      return;
    case GgufType::kI32:
      Put<int32_t>(out, static_cast<int32_t>(value.as_i64()));
      return;
    case GgufType::kU64:
      Put<uint64_t>(out, value.as_u64());
      return;
    case GgufType::kI64:
      Put<int64_t>(out, value.as_i64());
      return;
    case GgufType::kF32:
      Put<float>(out, static_cast<float>(value.as_f64()));
      return;
    case GgufType::kF64:
      Put<double>(out, value.as_f64());
      return;
    case GgufType::kBool:
      Put<uint8_t>(out, value.as_bool() ? 1 : 0);
      return;
  }
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  TESSERA_CHECK(alignment > 0 && std::has_single_bit(alignment)) << alignment;
  if (alignment != kGgufDefaultAlignment) SetU32("general.alignment", alignment);
}

GgufWriter::~GgufWriter() {
  if (file_) std::fclose(file_);
}

void GgufWriter::SetRaw(std::string_view key, GgufType type, std::string payload) {
  TESSERA_CHECK(file_ == nullptr) << "metadata must be set before Open()";
  std::string bytes;
  Put<uint32_t>(&bytes, static_cast<uint32_t>(type));
  bytes += payload;
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(bytes);
      return;
    }
  }
  metadata_.emplace_back(std::string(key), std::move(bytes));
}

void GgufWriter::SetU32(std::string_view key, uint32_t value) {
  std::string p;
  Put(&p, value);
  SetRaw(key, GgufType::kU32, std::move(p));
}
void GgufWriter::SetI32(std::string_view key, int32_t value) {
  std::string p;
  Put(&p, value);
  SetRaw(key, GgufType::kI32, std::move(p));
}
void GgufWriter::SetU64(std::string_view key, uint64_t value) {
  std::string p;
  Put(&p, value);
  SetRaw(key, GgufType::kU64, std::move(p));
}
void GgufWriter::SetF32(std::string_view key, float value) {
  std::string p;
  Put(&p, value);
  SetRaw(key, GgufType::kF32, std::move(p));
}
void GgufWriter::SetBool(std::string_view key, bool value) {
  std::string p;
  Put<uint8_t>(&p, value ? 1 : 0);
  SetRaw(key, GgufType::kBool, std::move(p));
}
void GgufWriter::SetString(std::string_view key, std::string_view value) {
  std::string p;
  PutString(&p, value);
  SetRaw(key, GgufType::kString, std::move(p));
}
void GgufWriter::SetStringArray(std::string_view key, std::span<const std::string> values) {
  std::string p;
  Put<uint32_t>(&p, static_cast<uint32_t>(GgufType::kString));
  Put<uint64_t>(&p, values.size());
  for (const std::string& v : values) PutString(&p, v);
  SetRaw(key, GgufType::kArray, std::move(p));
}
void GgufWriter::SetF32Array(std::string_view key, std::span<const float> values) {
  std::string p;
  Put<uint32_t>(&p, static_cast<uint32_t>(GgufType::kF32));
  Put<uint64_t>(&p, values.size());
  for (float v : values) Put(&p, v);
  SetRaw(key, GgufType::kArray, std::move(p));
}
void GgufWriter::SetI32Array(std::string_view key, std::span<const int32_t> values) {
  std::string p;
  Put<uint32_t>(&p, static_cast<uint32_t>(GgufType::kI32));
  Put<uint64_t>(&p, values.size());
  for (int32_t v : values) Put(&p, v);
  SetRaw(key, GgufType::kArray, std::move(p));
}
void GgufWriter::SetValue(std::string_view key, const GgufValue& value) {
  std::string p;
  PutValuePayload(&p, value);
  SetRaw(key, value.type(), std::move(p));
}

Status GgufWriter::AddTensor(std::string_view name, kernels::WeightType type,
                             std::vector<int64_t> dims) {
  TESSERA_CHECK(file_ == nullptr) << "tensors must be declared before Open()";
  std::string what = "tensor '" + std::string(name) + "'";
  if (name.empty() || name.size() > 63) {
    return InvalidArgumentError(what + ": name must be 1..63 bytes");
  }
  for (const TensorDecl& t : tensors_) {
    if (t.name == name) return InvalidArgumentError(what + " declared twice");
  }
  if (dims.empty() || dims.size() > static_cast<size_t>(kGgufMaxDims)) {
    return InvalidArgumentError(what + ": 1..4 dimensions supported");
  }
  const kernels::WeightTypeTraits& traits = kernels::TraitsOf(type);
  uint64_t rows = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1) return InvalidArgumentError(what + ": dimension < 1");
    if (i > 0) {
      if (rows > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dims[i])) {
        return InvalidArgumentError(what + ": size overflows");
      }
      rows *= static_cast<uint64_t>(dims[i]);
    }
  }
  if (dims[0] % traits.block_elems != 0) {
    return InvalidArgumentError(what + ": row length " + std::to_string(dims[0]) +
                                " is not a multiple of the " + std::string(traits.name) +
                                " block size " + std::to_string(traits.block_elems));
  }
  uint64_t row_bytes = static_cast<uint64_t>(dims[0] / traits.block_elems) * traits.block_bytes;
  if (row_bytes > (uint64_t{1} << 62) / rows) return InvalidArgumentError(what + ": too large");
  uint64_t offset = AlignUp(data_size_, alignment_);
  tensors_.push_back({std::string(name), type, std::move(dims), offset, row_bytes * rows});
  data_size_ = offset + row_bytes * rows;
  return Status::Ok();
}

Status GgufWriter::WriteBytes(const void* data, size_t size) {
  if (size == 0) return Status::Ok();
  if (std::fwrite(data, 1, size, file_) != size) {
    return InternalError("writing '" + path_ + "' failed at byte " + std::to_string(written_) +
                         ": " + std::strerror(errno));
  }
  written_ += size;
  return Status::Ok();
}

Status GgufWriter::WritePadding() {
  static constexpr uint8_t kZeros[256] = {};
  uint64_t pad = AlignUp(written_, alignment_) - written_;
  while (pad > 0) {
    size_t n = std::min<uint64_t>(pad, sizeof(kZeros));
    TESSERA_RETURN_IF_ERROR(WriteBytes(kZeros, n));
    pad -= n;
  }
  return Status::Ok();
}

std::string GgufWriter::Header(bool with_tensors) const {
  std::string header;
  Put<uint32_t>(&header, kGgufMagic);
  Put<uint32_t>(&header, 3);
  Put<uint64_t>(&header, with_tensors ? tensors_.size() : 0);
  Put<uint64_t>(&header, metadata_.size());
  for (const auto& [key, bytes] : metadata_) {
    PutString(&header, key);
    header += bytes;
  }
  if (!with_tensors) return header;
  for (const TensorDecl& t : tensors_) {
    PutString(&header, t.name);
    Put<uint32_t>(&header, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&header, static_cast<uint64_t>(d));
    Put<uint32_t>(&header, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&header, t.offset);
  }
  return header;
}

std::string GgufWriter::MetadataImage() const { return Header(false); }

Status GgufWriter::Open(const std::string& path) {
  TESSERA_CHECK(file_ == nullptr) << "Open() called twice";
  path_ = path;
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) {
    return InvalidArgumentError("cannot create '" + path + "': " + std::strerror(errno));
  }
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  const std::string header = Header(true);
  TESSERA_RETURN_IF_ERROR(WriteBytes(header.data(), header.size()));
  if (!tensors_.empty()) TESSERA_RETURN_IF_ERROR(WritePadding());
  return Status::Ok();
}

Status GgufWriter::Append(std::span<const uint8_t> bytes) {
  TESSERA_CHECK(file_ != nullptr) << "Append() before Open()";
  while (!bytes.empty()) {
    if (current_ >= tensors_.size()) {
      return InvalidArgumentError("'" + path_ + "': more tensor data appended than declared");
    }
    const TensorDecl& t = tensors_[current_];
    uint64_t n = std::min<uint64_t>(bytes.size(), t.size_bytes - current_done_);
    TESSERA_RETURN_IF_ERROR(WriteBytes(bytes.data(), n));
    bytes = bytes.subspan(n);
    current_done_ += n;
    if (current_done_ == t.size_bytes) {
      ++current_;
      current_done_ = 0;
      if (current_ < tensors_.size()) TESSERA_RETURN_IF_ERROR(WritePadding());
    }
  }
  return Status::Ok();
}

Status GgufWriter::Close() {
  TESSERA_CHECK(file_ != nullptr) << "Close() before Open()";
  Status status = Status::Ok();
  if (current_ != tensors_.size()) {
    status = InvalidArgumentError("'" + path_ + "': tensor '" + tensors_[current_].name +
                                  "' has only " + std::to_string(current_done_) + " of " +
                                  std::to_string(tensors_[current_].size_bytes) + " bytes written");
  }
  if (std::fclose(file_) != 0 && status.ok()) {
    status = InternalError("closing '" + path_ + "' failed: " + std::strerror(errno));
  }
  file_ = nullptr;
  return status;
}

}  // namespace tessera::model
