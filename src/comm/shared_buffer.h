// SharedBuffer: memory of one rank that every same-host peer of its communicator
// has mapped (Communicator::AllocateShared; MPI_Win_allocate_shared's memory,
// nccl-tests' registered buffers). A collective message whose bytes lie in it goes
// to such a peer as a 32-byte descriptor {buffer, offset} through the ring, and the
// peer copies or reduces straight from its read-only mapping: one pass over the
// bytes instead of a copy into the ring and another out of it, and no page pinning
// (process_vm_readv's single copy pins every page it reads). The send completes once
// the peer has read it. Without a same-host peer it is plain memory.
//
// Layer: comm. Move-only; freeing it (on any thread) unmaps it here, while peers keep
// their read mapping until their communicator goes: allocate once and reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace tessera::comm {

class WindowTable;

// A memory mapping, unmapped on destruction. Move-only.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  MappedRegion(MappedRegion&& other) noexcept { *this = std::move(other); }
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }

  // A new POSIX shared-memory object `name` of `bytes` (its pages reserved, so a
  // full /dev/shm is an error here rather than a SIGBUS later), mapped read-write.
  static Result<MappedRegion> CreateShared(const std::string& name, size_t bytes);
  // Peer's object `name`, mapped read-only; it must be exactly `bytes` long.
  static Result<MappedRegion> OpenShared(const std::string& name, size_t bytes);
  // Private anonymous memory.
  static Result<MappedRegion> Anonymous(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class SharedBuffer {
 public:
  SharedBuffer() = default;
  SharedBuffer(SharedBuffer&&) noexcept = default;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer();

  uint8_t* data() const { return region_.data(); }
  size_t size() const { return size_; }
  // Whether some peer maps it (false: no same-host peer, plain memory).
  bool shared() const { return shared_; }

 private:
  friend class Communicator;
  void Release();

  MappedRegion region_;
  size_t size_ = 0;
  bool shared_ = false;
  uint64_t id_ = 0;
  std::weak_ptr<WindowTable> table_;
};

}  // namespace tessera::comm
