// GgufValue, the metadata type names and GgufFile's typed metadata getters.
#include <bit>
#include <cstring>
#include <limits>

#include "model/gguf.h"
#include "model/gguf_internal.h"

namespace tessera::model {
namespace internal {

size_t ScalarSize(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownType(uint32_t id) { return id <= static_cast<uint32_t>(GgufType::kF64); }

bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

uint64_t DecodeScalarBits(GgufType type, const uint8_t* p) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kBool:
      return p[0];
    case GgufType::kI8:
      return static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(p[0])));
    case GgufType::kU16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case GgufType::kI16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return static_cast<uint64_t>(static_cast<int64_t>(v));
    }
    case GgufType::kU32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case GgufType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<uint64_t>(static_cast<int64_t>(v));
    }
    case GgufType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return std::bit_cast<uint64_t>(static_cast<double>(v));
    }
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case GgufType::kString:
    case GgufType::kArray:
      break;
  }
  return 0;
}

}  // namespace internal

using internal::DecodeScalarBits;
using internal::IsSigned;
using internal::ScalarSize;

std::string GgufTypeName(GgufType type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  uint32_t id = static_cast<uint32_t>(type);
  if (id < std::size(kNames)) return kNames[id];
  return "type " + std::to_string(id);
}

// ---------------------------------------------------------------- GgufValue

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

uint64_t GgufValue::as_u64() const {
  TESSERA_CHECK(is_integer() && !IsSigned(type_)) << GgufTypeName(type_);
  return bits_;
}
int64_t GgufValue::as_i64() const {
  TESSERA_CHECK(is_integer() && IsSigned(type_)) << GgufTypeName(type_);
  return static_cast<int64_t>(bits_);
}
double GgufValue::as_f64() const {
  TESSERA_CHECK(is_float()) << GgufTypeName(type_);
  return std::bit_cast<double>(bits_);
}
bool GgufValue::as_bool() const {
  TESSERA_CHECK(type_ == GgufType::kBool) << GgufTypeName(type_);
  return bits_ != 0;
}
std::string_view GgufValue::as_string() const {
  TESSERA_CHECK(type_ == GgufType::kString) << GgufTypeName(type_);
  return string_;
}

std::string GgufValue::Summary() const {
  constexpr size_t kMaxChars = 60;
  switch (type_) {
    case GgufType::kString: {
      std::string s(string_.substr(0, kMaxChars));
      for (char& c : s) {
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
      }
      return "\"" + s + (string_.size() > kMaxChars ? "…\"" : "\"");
    }
    case GgufType::kArray:
      return "[" + GgufTypeName(array_type_) + " x " + std::to_string(array_size_) + "]";
    case GgufType::kBool:
      return bits_ ? "true" : "false";
    case GgufType::kF32:
    case GgufType::kF64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", as_f64());
      return buf;
    }
    default:
      return IsSigned(type_) ? std::to_string(static_cast<int64_t>(bits_)) : std::to_string(bits_);
  }
}

std::string GgufTensor::ShapeString() const {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

// ---------------------------------------------------------------- GgufFile metadata

const GgufValue* GgufFile::Find(std::string_view key) const {
  for (const GgufKeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

namespace {

Status Missing(const GgufFile& file, std::string_view key) {
  return NotFoundError("GGUF '" + file.name() + "': metadata '" + std::string(key) +
                       "' is missing");
}

Status WrongType(const GgufFile& file, std::string_view key, const GgufValue& v,
                 std::string_view expected) {
  return InvalidArgumentError("GGUF '" + file.name() + "': metadata '" + std::string(key) +
                              "' has type " + GgufTypeName(v.type()) + " (expected " +
                              std::string(expected) + ")");
}

// The value of an integer GgufValue as int64, or nullopt when it does not fit.
std::optional<int64_t> IntegerValue(const GgufValue& v) {
  if (IsSigned(v.type())) return v.as_i64();
  uint64_t u = v.as_u64();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

}  // namespace

Result<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (v->type() != GgufType::kString) return WrongType(*this, key, *v, "string");
  return v->as_string();
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (!v->is_integer()) return WrongType(*this, key, *v, "an integer");
  std::optional<int64_t> value = IntegerValue(*v);
  if (!value) {
    return InvalidArgumentError("GGUF '" + name_ + "': metadata '" + std::string(key) +
                                "' = " + v->Summary() + " is too large");
  }
  return *value;
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(int64_t value, GetInt(key));
  if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("GGUF '" + name_ + "': metadata '" + std::string(key) +
                                "' = " + std::to_string(value) + " does not fit in u32");
  }
  return static_cast<uint32_t>(value);
}

Result<float> GgufFile::GetF32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (!v->is_float()) return WrongType(*this, key, *v, "f32");
  return static_cast<float>(v->as_f64());
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (v->type() != GgufType::kBool) return WrongType(*this, key, *v, "bool");
  return v->as_bool();
}

Result<int64_t> GgufFile::GetIntOr(std::string_view key, int64_t fallback) const {
  if (!Has(key)) return fallback;
  return GetInt(key);
}
Result<float> GgufFile::GetF32Or(std::string_view key, float fallback) const {
  if (!Has(key)) return fallback;
  return GetF32(key);
}
Result<bool> GgufFile::GetBoolOr(std::string_view key, bool fallback) const {
  if (!Has(key)) return fallback;
  return GetBool(key);
}
Result<std::string_view> GgufFile::GetStringOr(std::string_view key,
                                               std::string_view fallback) const {
  if (!Has(key)) return fallback;
  return GetString(key);
}

Result<std::span<const std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (v->type() != GgufType::kArray || v->array_type() != GgufType::kString) {
    return WrongType(*this, key, *v, "array of string");
  }
  return v->array_strings();
}

Result<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  if (v->type() != GgufType::kArray ||
      (v->array_type() != GgufType::kF32 && v->array_type() != GgufType::kF64)) {
    return WrongType(*this, key, *v, "array of f32");
  }
  size_t size = ScalarSize(v->array_type());
  std::vector<float> out(v->array_size());
  const uint8_t* p = v->array_raw().data();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] =
        static_cast<float>(std::bit_cast<double>(DecodeScalarBits(v->array_type(), p + i * size)));
  }
  return out;
}

Result<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(*this, key);
  GgufType t = v->array_type();
  bool integer =
      t != GgufType::kF32 && t != GgufType::kF64 && t != GgufType::kBool && ScalarSize(t) != 0;
  if (v->type() != GgufType::kArray || !integer) {
    return WrongType(*this, key, *v, "array of integers");
  }
  size_t size = ScalarSize(t);
  std::vector<int32_t> out(v->array_size());
  const uint8_t* p = v->array_raw().data();
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t bits = DecodeScalarBits(t, p + i * size);
    bool fits = IsSigned(t) ? static_cast<int64_t>(bits) >= std::numeric_limits<int32_t>::min() &&
                                  static_cast<int64_t>(bits) <= std::numeric_limits<int32_t>::max()
                            : bits <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    if (!fits) {
      return InvalidArgumentError("GGUF '" + name_ + "': metadata '" + std::string(key) +
                                  "' element " + std::to_string(i) + " does not fit in i32");
    }
    out[i] = static_cast<int32_t>(static_cast<int64_t>(bits));
  }
  return out;
}

}  // namespace tessera::model
