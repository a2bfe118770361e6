#include "kv/cache_event_log.h"

#include <algorithm>

namespace tessera::kv {

CacheEventLog::CacheEventLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void CacheEventLog::Stored(const BlockHash& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.insert(hash);
  Append(true, hash);
}

void CacheEventLog::Removed(const BlockHash& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.erase(hash);
  Append(false, hash);
}

void CacheEventLog::Append(bool stored, const BlockHash& hash) {
  events_.push_back({stored, hash});
  if (events_.size() > capacity_) {
    events_.pop_front();
    ++first_;
  }
}

CacheEventBatch CacheEventLog::Read(uint64_t after, size_t max_events) const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheEventBatch batch;
  const uint64_t end = first_ + events_.size();
  batch.next = end;
  if (after < first_ || after > end) {
    batch.snapshot = true;
    batch.cached.assign(cached_.begin(), cached_.end());
    return batch;
  }
  const uint64_t count = std::min<uint64_t>(end - after, max_events);
  const auto from = events_.begin() + static_cast<std::ptrdiff_t>(after - first_);
  batch.events.assign(from, from + static_cast<std::ptrdiff_t>(count));
  batch.next = after + count;
  return batch;
}

size_t CacheEventLog::num_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_.size();
}

}  // namespace tessera::kv
