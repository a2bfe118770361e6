#include "comm/shared_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/unique_fd.h"
#include "comm/window_table.h"

namespace tessera::comm {

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MappedRegion::~MappedRegion() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

Result<MappedRegion> MappedRegion::CreateShared(const std::string& name, size_t bytes) {
  ::shm_unlink(name.c_str());  // a stale object of a crashed run with the same name
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return InternalError("shm_open(" + name + "): " + std::strerror(errno));
  int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (err != 0) {
    ::shm_unlink(name.c_str());
    return ResourceExhaustedError("cannot reserve " + std::to_string(bytes) +
                                  " bytes of shared memory for " + name + ": " +
                                  std::strerror(err) + " (is /dev/shm full?)");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    err = errno;
    ::shm_unlink(name.c_str());
    return ResourceExhaustedError("cannot map " + std::to_string(bytes) + " bytes of " + name +
                                  ": " + std::strerror(err));
  }
  return MappedRegion(p, bytes);
}

Result<MappedRegion> MappedRegion::OpenShared(const std::string& name, size_t bytes) {
  UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (!fd.valid()) return UnavailableError("shm_open(" + name + "): " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    return InvalidArgumentError("shared memory " + name + " is not the " + std::to_string(bytes) +
                                " bytes its owner announced");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    return ResourceExhaustedError("cannot map " + std::to_string(bytes) + " bytes of " + name +
                                  ": " + std::strerror(errno));
  }
  return MappedRegion(p, bytes);
}

Result<MappedRegion> MappedRegion::Anonymous(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhaustedError("cannot map " + std::to_string(bytes) +
                                  " bytes: " + std::strerror(errno));
  }
  return MappedRegion(p, bytes);
}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    region_ = std::move(other.region_);
    size_ = std::exchange(other.size_, 0);
    shared_ = std::exchange(other.shared_, false);
    id_ = std::exchange(other.id_, 0);
    table_ = std::move(other.table_);
  }
  return *this;
}

SharedBuffer::~SharedBuffer() { Release(); }

void SharedBuffer::Release() {
  if (auto table = table_.lock()) table->Remove(id_);
  table_.reset();
  region_ = MappedRegion();
}

}  // namespace tessera::comm
