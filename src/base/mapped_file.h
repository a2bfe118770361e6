// MappedFile: a read-only memory mapping of a whole file (model weights), unmapped
// on destruction. Layer: base; model/ maps GGUF files with it. Move-only;
// concurrent reads of the mapping are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace tessera {

class MappedFile {
 public:
  // Maps `path` read-only. Fails with NotFound / InvalidArgument naming the path.
  static Result<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_bytes_}; }
  const uint8_t* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

  // Advises the kernel that [offset, offset + length) will be read soon (or not).
  void AdviseWillNeed(size_t offset, size_t length) const;
  void AdviseDontNeed(size_t offset, size_t length) const;

 private:
  void Unmap();

  const uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
  std::string path_;
};

}  // namespace tessera
