// Ledger: per-communicator traffic accounting — for every primitive, how many
// calls and how many payload bytes this rank sent and received (message headers
// excluded), so measured traffic can be held against plan/'s prediction.
// Layer: comm. Not thread-safe: owned and updated by the communicator's thread;
// read it between operations.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::comm {

enum class Primitive : uint8_t {
  kSend,
  kRecv,
  kBroadcast,
  kReduce,
  kAllReduce,
  kGather,
  kScatter,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllv,
  kBarrier,
  kCount,
};

std::string_view PrimitiveName(Primitive primitive);  // "all_reduce", …

struct LedgerEntry {
  uint64_t calls = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class Ledger {
 public:
  const LedgerEntry& entry(Primitive p) const { return entries_[static_cast<size_t>(p)]; }
  LedgerEntry& mutable_entry(Primitive p) { return entries_[static_cast<size_t>(p)]; }
  LedgerEntry Total() const;
  void Reset() { entries_ = {}; }
  // One line per primitive that was used: "all_reduce calls=3 sent=… received=…".
  std::string ToString() const;
  // {"all_reduce":{"calls":3,"bytes_sent":…,"bytes_received":…},…}
  std::string ToJson() const;

 private:
  std::array<LedgerEntry, static_cast<size_t>(Primitive::kCount)> entries_{};
};

}  // namespace tessera::comm
