#include "comm/rendezvous/store.h"

namespace tessera::comm {

Status Store::Wait(std::span<const std::string> keys, Deadline deadline) {
  for (const std::string& key : keys) {
    TESSERA_ASSIGN_OR_RETURN(auto value, Get(key, deadline));
    (void)value;
  }
  return Status::Ok();
}

Status Store::SetString(std::string_view key, std::string_view value) {
  return Set(
      key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(value.data()), value.size()));
}

Result<std::string> Store::GetString(std::string_view key, Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(auto bytes, Get(key, deadline));
  return std::string(bytes.begin(), bytes.end());
}

std::string PrefixStore::Full(std::string_view key) const {
  std::string full = prefix_;
  full += '/';
  full += key;
  return full;
}

Status PrefixStore::Set(std::string_view key, std::span<const uint8_t> value) {
  return base_.Set(Full(key), value);
}

Result<std::vector<uint8_t>> PrefixStore::Get(std::string_view key, Deadline deadline) {
  return base_.Get(Full(key), deadline);
}

Result<int64_t> PrefixStore::Add(std::string_view key, int64_t delta) {
  return base_.Add(Full(key), delta);
}

}  // namespace tessera::comm
