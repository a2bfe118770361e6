#include "comm/window_table.h"

#include <cstdint>
#include <vector>

namespace tessera::comm {

void WindowTable::Add(uint64_t id, const void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Entry{id, reinterpret_cast<uintptr_t>(base), bytes});
  count_.store(entries_.size(), std::memory_order_relaxed);
}

void WindowTable::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(entries_, [id](const Entry& e) { return e.id == id; });
  count_.store(entries_.size(), std::memory_order_relaxed);
}

std::optional<WindowTable::Hit> WindowTable::Find(const void* data, size_t bytes) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& e : entries_) {
    if (begin >= e.base && begin - e.base <= e.bytes && bytes <= e.bytes - (begin - e.base)) {
      return Hit{e.id, begin - e.base};
    }
  }
  return std::nullopt;
}

}  // namespace tessera::comm
