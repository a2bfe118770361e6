#include "model/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace tessera::model {
namespace {

using nlohmann::json;

}  // namespace

int SafetensorsDtypeBytes(std::string_view dtype) {
  static constexpr std::pair<std::string_view, int> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"U64", 8}, {"I32", 4}, {"U32", 4},  {"I16", 2},     {"U16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kSizes) {
    if (name == dtype) return bytes;
  }
  return 0;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  SafetensorsFile file;
  file.name_ = path;
  file.mapping_ = std::make_unique<MappedFile>(std::move(mapped));
  TESSERA_RETURN_IF_ERROR(file.Parse(file.mapping_->bytes()));
  return file;
}

Result<SafetensorsFile> SafetensorsFile::FromBytes(std::span<const uint8_t> bytes,
                                                   std::string name) {
  SafetensorsFile file;
  file.name_ = std::move(name);
  TESSERA_RETURN_IF_ERROR(file.Parse(bytes));
  return file;
}

Status SafetensorsFile::Parse(std::span<const uint8_t> bytes) {
  auto error = [this](const std::string& what) {
    return InvalidArgumentError("safetensors '" + name_ + "': " + what);
  };
  if (bytes.size() < 8) {
    return error("truncated file: " + std::to_string(bytes.size()) +
                 " bytes, too short for the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > bytes.size() - 8 || header_bytes > kSafetensorsMaxHeaderBytes) {
    return error("header length " + std::to_string(header_bytes) + " exceeds the " +
                 std::to_string(bytes.size() - 8) +
                 " bytes after it (truncated file, or not safetensors)");
  }
  const auto* begin = reinterpret_cast<const char*>(bytes.data() + 8);
  json header;
  try {
    header = json::parse(begin, begin + header_bytes);
  } catch (const json::parse_error& e) {
    return error("the header is not valid JSON (at byte " + std::to_string(8 + e.byte) +
                 "): " + e.what());
  }
  if (!header.is_object()) return error("the header is not a JSON object");
  const std::span<const uint8_t> data = bytes.subspan(8 + header_bytes);
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    const std::string what = "tensor '" + key + "'";
    if (!entry.is_object()) return error(what + ": its entry is not an object");
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) return error(what + " has no dtype string");
    if (shape == entry.end() || !shape->is_array()) return error(what + " has no shape array");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return error(what + " has no data_offsets [begin, end]");
    }
    SafetensorsTensor t;
    t.name = key;
    t.dtype = dtype->get<std::string>();
    const int element_bytes = SafetensorsDtypeBytes(t.dtype);
    if (element_bytes == 0) return error(what + " has unknown dtype '" + t.dtype + "'");
    for (const json& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return error(what + " has shape entry " + d.dump() + " (expected 0..2^40)");
      }
      const auto dim = static_cast<int64_t>(d.get<uint64_t>());
      if (dim != 0 && t.num_elements > std::numeric_limits<int64_t>::max() / element_bytes / dim) {
        return error(what + ": the size of its shape overflows");
      }
      t.num_elements *= dim;
      t.shape.push_back(dim);
    }
    const uint64_t first = (*offsets)[0].get<uint64_t>();
    const uint64_t last = (*offsets)[1].get<uint64_t>();
    if (first > last || last > data.size()) {
      return error(what + " has data_offsets [" + std::to_string(first) + ", " +
                   std::to_string(last) + "] outside the " + std::to_string(data.size()) +
                   " data bytes (truncated file?)");
    }
    const auto need = static_cast<uint64_t>(t.num_elements) * static_cast<uint64_t>(element_bytes);
    if (last - first != need) {
      return error(what + " holds " + std::to_string(last - first) + " bytes, but " + t.dtype +
                   " of its shape needs " + std::to_string(need));
    }
    t.data = data.subspan(first, last - first);
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.data.data() < b.data.data();
            });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const SafetensorsTensor& prev = tensors_[i - 1];
    if (prev.data.data() + prev.data.size() > tensors_[i].data.data()) {
      return error("tensors '" + prev.name + "' and '" + tensors_[i].name + "' overlap");
    }
  }
  return Status::Ok();
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const SafetensorsEntry& e : entries) {
    const int element_bytes = SafetensorsDtypeBytes(e.dtype);
    if (element_bytes == 0) {
      return InvalidArgumentError("safetensors '" + path + "': unknown dtype '" + e.dtype + "'");
    }
    uint64_t n = static_cast<uint64_t>(element_bytes);
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    sizes.push_back(n);
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return InvalidArgumentError("cannot create '" + path + "': " + std::strerror(errno));
  }
  const uint64_t length = text.size();
  bool ok = std::fwrite(&length, 8, 1, f) == 1 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  Status status;
  std::string bytes;
  for (size_t i = 0; ok && status.ok() && i < entries.size(); ++i) {
    bytes.clear();
    status = entries[i].fill(&bytes);
    if (status.ok() && bytes.size() != sizes[i]) {
      status = InternalError("safetensors '" + path + "': tensor '" + entries[i].name + "' got " +
                             std::to_string(bytes.size()) + " bytes, expected " +
                             std::to_string(sizes[i]));
    }
    if (status.ok()) ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  }
  if (std::fclose(f) != 0) ok = false;
  if (status.ok() && !ok)
    status = InternalError("writing '" + path + "' failed: " + std::strerror(errno));
  if (!status.ok()) std::remove(path.c_str());
  return status;
}

}  // namespace tessera::model
