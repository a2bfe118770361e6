#include "serve/replica_state.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace tessera::serve {

using nlohmann::json;

std::string BlockHashToHex(const kv::BlockHash& hash) {
  char out[33];
  std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(hash.high),
                static_cast<unsigned long long>(hash.low));
  return out;
}

Result<kv::BlockHash> BlockHashFromHex(std::string_view hex) {
  if (hex.size() != 32) return InvalidArgumentError("a block hash is 32 hex digits");
  kv::BlockHash hash;
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return InvalidArgumentError("a block hash is 32 lowercase hex digits");
    }
    uint64_t& half = i < 16 ? hash.high : hash.low;
    half = (half << 4) | static_cast<uint64_t>(digit);
  }
  return hash;
}

std::string ReplicaStateToJson(const ReplicaState& s) {
  json events = json::array();
  for (const kv::CacheEvent& e : s.cache.events) {
    events.push_back({e.stored ? "+" : "-", BlockHashToHex(e.hash)});
  }
  json cached = json::array();
  for (const kv::BlockHash& h : s.cache.cached) cached.push_back(BlockHashToHex(h));
  json out = {{"instance", s.instance},
              {"waiting", s.waiting},
              {"running", s.running},
              {"kv_blocks_used", s.kv_blocks_used},
              {"kv_blocks_total", s.kv_blocks_total},
              {"recovering", s.recovering},
              {"prefix_cache", s.prefix_cache},
              {"block_size", s.block_size},
              {"root", BlockHashToHex(s.root)},
              {"snapshot", s.cache.snapshot},
              {"cached", std::move(cached)},
              {"events", std::move(events)},
              {"next", s.cache.next}};
  return out.dump();
}

Result<ReplicaState> ReplicaStateFromJson(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError("the replica's state is not a JSON object");
  ReplicaState s;
  try {
    s.instance = j.at("instance").get<std::string>();
    s.waiting = j.at("waiting").get<int64_t>();
    s.running = j.at("running").get<int64_t>();
    s.kv_blocks_used = j.at("kv_blocks_used").get<int64_t>();
    s.kv_blocks_total = j.at("kv_blocks_total").get<int64_t>();
    s.recovering = j.at("recovering").get<bool>();
    s.prefix_cache = j.at("prefix_cache").get<bool>();
    s.block_size = j.at("block_size").get<int64_t>();
    TESSERA_ASSIGN_OR_RETURN(s.root, BlockHashFromHex(j.at("root").get<std::string>()));
    s.cache.snapshot = j.at("snapshot").get<bool>();
    s.cache.next = j.at("next").get<uint64_t>();
    for (const json& h : j.at("cached")) {
      TESSERA_ASSIGN_OR_RETURN(kv::BlockHash hash, BlockHashFromHex(h.get<std::string>()));
      s.cache.cached.push_back(hash);
    }
    for (const json& e : j.at("events")) {
      const std::string op = e.at(0).get<std::string>();
      if (op != "+" && op != "-") return InvalidArgumentError("a cache event is + or -");
      TESSERA_ASSIGN_OR_RETURN(kv::BlockHash hash, BlockHashFromHex(e.at(1).get<std::string>()));
      s.cache.events.push_back({op == "+", hash});
    }
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("the replica's state is malformed: ") + e.what());
  }
  return s;
}

}  // namespace tessera::serve
