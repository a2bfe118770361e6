// Store: the key-value rendezvous that ranks use to find each other (addresses,
// host identities, shared-memory names) and to count arrivals. Implementations:
// TcpStore (across hosts, cluster-token authenticated), FileStore (a shared
// directory, for local tests) and HashStore (in-process, ranks as threads).
// Layer: comm. Every implementation is thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace tessera::comm {

class Store {
 public:
  virtual ~Store() = default;

  // Sets (or overwrites) `key`.
  virtual Status Set(std::string_view key, std::span<const uint8_t> value) = 0;
  // Returns the value of `key`, waiting until some rank sets it or `deadline`.
  virtual Result<std::vector<uint8_t>> Get(std::string_view key, Deadline deadline) = 0;
  // Atomically adds `delta` to the integer at `key` (missing = 0); returns the sum.
  virtual Result<int64_t> Add(std::string_view key, int64_t delta) = 0;
  // Waits until every key exists.
  virtual Status Wait(std::span<const std::string> keys, Deadline deadline);

  Status SetString(std::string_view key, std::string_view value);
  Result<std::string> GetString(std::string_view key, Deadline deadline);
};

// A key-scoped view: every key is prefixed with `prefix` + "/". Borrows `base`.
class PrefixStore : public Store {
 public:
  PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  Status Set(std::string_view key, std::span<const uint8_t> value) override;
  Result<std::vector<uint8_t>> Get(std::string_view key, Deadline deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta) override;

 private:
  std::string Full(std::string_view key) const;
  Store& base_;
  std::string prefix_;
};

// Limits enforced on every store (and on the wire by TcpStore).
inline constexpr size_t kMaxStoreKeyBytes = 4096;
inline constexpr size_t kMaxStoreValueBytes = size_t{64} << 20;

}  // namespace tessera::comm
