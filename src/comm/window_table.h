// WindowTable: this rank's shared buffers by address, so the messenger can send a
// message that lies in one as a descriptor {buffer, offset} (shared_buffer.h).
// Layer: comm. Filled by Communicator::AllocateShared, emptied by SharedBuffer when
// it is freed (on any thread), read by the messenger's sends (messenger_send.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace tessera::comm {

// This rank's shared buffers (Communicator::AllocateShared): memory that every
// same-host peer of the communicator has mapped, so a message in it needs no copy
// into the ring. Thread-safe: a buffer may be freed on another thread.
class WindowTable {
 public:
  struct Hit {
    uint64_t id = 0;
    uint64_t offset = 0;
  };
  void Add(uint64_t id, const void* base, size_t bytes);
  void Remove(uint64_t id);
  // The buffer that holds all of [data, data + bytes), if one does.
  std::optional<Hit> Find(const void* data, size_t bytes) const;
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

 private:
  struct Entry {
    uint64_t id;
    uintptr_t base;
    size_t bytes;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<size_t> count_{0};
};

}  // namespace tessera::comm
