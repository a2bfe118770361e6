#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/unique_fd.h"

namespace tessera {

Result<MappedFile> MappedFile::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    std::string message = "cannot open '" + path + "': " + std::strerror(err);
    return err == ENOENT ? NotFoundError(message) : InvalidArgumentError(message);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return InvalidArgumentError("cannot stat '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError("'" + path + "' is not a regular file");
  MappedFile file;
  file.path_ = path;
  file.size_bytes_ = static_cast<size_t>(st.st_size);
  if (file.size_bytes_ == 0) return file;
  void* addr = ::mmap(nullptr, file.size_bytes_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (addr == MAP_FAILED) {
    return InvalidArgumentError("cannot mmap '" + path + "': " + std::strerror(errno));
  }
  file.data_ = static_cast<const uint8_t*>(addr);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
  data_ = nullptr;
  size_bytes_ = 0;
}

namespace {
void Advise(const uint8_t* data, size_t size, size_t offset, size_t length, int advice) {
  if (data == nullptr || offset >= size) return;
  const size_t page = 4096;
  size_t begin = offset & ~(page - 1);
  size_t end = std::min(size, offset + length);
  ::madvise(const_cast<uint8_t*>(data) + begin, end - begin, advice);
}
}  // namespace

void MappedFile::AdviseWillNeed(size_t offset, size_t length) const {
  Advise(data_, size_bytes_, offset, length, MADV_WILLNEED);
}
void MappedFile::AdviseDontNeed(size_t offset, size_t length) const {
  Advise(data_, size_bytes_, offset, length, MADV_DONTNEED);
}

}  // namespace tessera
