#include "comm/ledger.h"

#include <cinttypes>
#include <cstdio>

namespace tessera::comm {

std::string_view PrimitiveName(Primitive primitive) {
  switch (primitive) {
    case Primitive::kSend:
      return "send";
    case Primitive::kRecv:
      return "recv";
    case Primitive::kBroadcast:
      return "broadcast";
    case Primitive::kReduce:
      return "reduce";
    case Primitive::kAllReduce:
      return "all_reduce";
    case Primitive::kGather:
      return "gather";
    case Primitive::kScatter:
      return "scatter";
    case Primitive::kAllGather:
      return "all_gather";
    case Primitive::kReduceScatter:
      return "reduce_scatter";
    case Primitive::kAllToAll:
      return "all_to_all";
    case Primitive::kAllToAllv:
      return "all_to_allv";
    case Primitive::kBarrier:
      return "barrier";
    case Primitive::kCount:
      break;
  }
  return "?";
}

LedgerEntry Ledger::Total() const {
  LedgerEntry total;
  for (const auto& e : entries_) {
    total.calls += e.calls;
    total.bytes_sent += e.bytes_sent;
    total.bytes_received += e.bytes_received;
  }
  return total;
}

std::string Ledger::ToString() const {
  std::string out;
  char line[160];
  for (size_t i = 0; i < entries_.size(); ++i) {
    const LedgerEntry& e = entries_[i];
    if (e.calls == 0) continue;
    std::snprintf(line, sizeof(line),
                  "%-15s calls=%" PRIu64 " bytes_sent=%" PRIu64 " bytes_received=%" PRIu64 "\n",
                  std::string(PrimitiveName(static_cast<Primitive>(i))).c_str(), e.calls,
                  e.bytes_sent, e.bytes_received);
    out += line;
  }
  return out;
}

std::string Ledger::ToJson() const {
  std::string out = "{";
  char item[200];
  bool first = true;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const LedgerEntry& e = entries_[i];
    if (e.calls == 0) continue;
    std::snprintf(item, sizeof(item),
                  "%s\"%s\":{\"calls\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
                  ",\"bytes_received\":%" PRIu64 "}",
                  first ? "" : ",", std::string(PrimitiveName(static_cast<Primitive>(i))).c_str(),
                  e.calls, e.bytes_sent, e.bytes_received);
    out += item;
    first = false;
  }
  return out + "}";
}

}  // namespace tessera::comm
