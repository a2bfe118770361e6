#include "comm/rendezvous/hash_store.h"

#include <charconv>
#include <string>

namespace tessera::comm {

Result<int64_t> ParseCounter(std::span<const uint8_t> bytes, std::string_view key) {
  if (bytes.empty()) return int64_t{0};
  const char* begin = reinterpret_cast<const char*>(bytes.data());
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(begin, begin + bytes.size(), value);
  if (ec != std::errc() || ptr != begin + bytes.size()) {
    return InvalidArgumentError("store key '" + std::string(key) + "' does not hold a counter");
  }
  return value;
}

std::vector<uint8_t> EncodeCounter(int64_t value) {
  std::string text = std::to_string(value);
  return std::vector<uint8_t>(text.begin(), text.end());
}

Status HashStore::Set(std::string_view key, std::span<const uint8_t> value) {
  if (key.size() > kMaxStoreKeyBytes || value.size() > kMaxStoreValueBytes) {
    return InvalidArgumentError("store key or value too large");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[std::string(key)] = std::vector<uint8_t>(value.begin(), value.end());
  }
  changed_.notify_all();
  return Status::Ok();
}

Result<std::vector<uint8_t>> HashStore::Get(std::string_view key, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    if (deadline.never()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline.when()) == std::cv_status::timeout) {
      if (values_.find(key) == values_.end()) {
        return DeadlineExceededError("store key '" + std::string(key) + "' was never set");
      }
    }
  }
}

Result<int64_t> HashStore::Add(std::string_view key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = values_[std::string(key)];
    TESSERA_ASSIGN_OR_RETURN(int64_t current, ParseCounter(slot, key));
    sum = current + delta;
    slot = EncodeCounter(sum);
  }
  changed_.notify_all();
  return sum;
}

}  // namespace tessera::comm
