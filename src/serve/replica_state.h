// ReplicaState: what a replica's `GET /internal/state?instance=I&after=N` tells
// the data-parallel front that polls it — its instance (a random id per server
// process: a restarted replica is a new instance), its scheduler's load (waiting,
// running, KV blocks), whether its ranks are being restarted, and its prefix
// cache's events after the front's cursor N (or a snapshot of every cached block
// hash when N is not a cursor of instance I), with the root hash and block size
// the front needs to hash prompts as the replica does. One JSON format, written
// by OpenAiServer and read by DpFront. Layer: serve. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "kv/block_hash.h"
#include "kv/cache_event_log.h"

namespace tessera::serve {

struct ReplicaState {
  std::string instance;
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  bool recovering = false;
  bool prefix_cache = false;
  int64_t block_size = 0;
  kv::BlockHash root;
  kv::CacheEventBatch cache;  // events after the cursor asked for, or a snapshot
};

std::string ReplicaStateToJson(const ReplicaState& state);
// InvalidArgument for a body that is not a ReplicaState.
Result<ReplicaState> ReplicaStateFromJson(std::string_view body);

// 32 lowercase hex digits (high then low half), and back.
std::string BlockHashToHex(const kv::BlockHash& hash);
Result<kv::BlockHash> BlockHashFromHex(std::string_view hex);

}  // namespace tessera::serve
