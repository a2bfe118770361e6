// CacheEventLog: what a prefix cache stores and forgets, as an ordered, bounded
// log of block hashes ("stored" when a full block is registered, "removed" when
// it is evicted or the cache is cleared) plus the set cached now, so that a
// reader elsewhere — the data-parallel front's prefix-affinity router — can keep
// its own copy of what this replica caches by reading the log incrementally, and
// start over from a snapshot when it fell behind. Layer: kv; BlockAllocator
// writes it (SetEventLog), the serving layer reads it for /internal/cache_events.
// Thread-safe: one writer (the scheduler thread) and any number of readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "kv/block_hash.h"

namespace tessera::kv {

struct CacheEvent {
  bool stored = true;  // false: removed
  BlockHash hash;
};

// What a reader gets: events after its cursor, or (snapshot) the whole cached set
// when its cursor is older than the log keeps (or not of this log at all).
struct CacheEventBatch {
  bool snapshot = false;
  std::vector<BlockHash> cached;   // snapshot only: every hash cached now
  std::vector<CacheEvent> events;  // otherwise: in order
  uint64_t next = 0;               // the cursor to read from next
};

class CacheEventLog {
 public:
  // Keeps the last `capacity` events (a reader further behind gets a snapshot).
  explicit CacheEventLog(size_t capacity = 1 << 16);

  void Stored(const BlockHash& hash);
  void Removed(const BlockHash& hash);

  // Events from cursor `after` on (at most max_events of them; `next` says where
  // to go on), or a snapshot when `after` is not a cursor this log can serve
  // (older than what it keeps, or beyond its end: a reader of an earlier log).
  CacheEventBatch Read(uint64_t after, size_t max_events) const;
  size_t num_cached() const;

 private:
  void Append(bool stored, const BlockHash& hash);  // mu_ held

  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<CacheEvent> events_;  // events [first_, first_ + events_.size())
  uint64_t first_ = 0;
  std::unordered_set<BlockHash, BlockHashHasher> cached_;
};

}  // namespace tessera::kv
