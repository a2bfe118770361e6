// HashStore: an in-process Store (a map behind a mutex) for ranks that run as
// threads of one process, e.g. the collective test matrix. Layer: comm. Thread-safe.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/rendezvous/store.h"

namespace tessera::comm {

class HashStore : public Store {
 public:
  Status Set(std::string_view key, std::span<const uint8_t> value) override;
  Result<std::vector<uint8_t>> Get(std::string_view key, Deadline deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>, std::less<>> values_;
};

// Helpers shared by the stores: the decimal encoding of counters.
Result<int64_t> ParseCounter(std::span<const uint8_t> bytes, std::string_view key);
std::vector<uint8_t> EncodeCounter(int64_t value);

}  // namespace tessera::comm
