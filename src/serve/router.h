// Router: which replica of a data-parallel front serves a request — round-robin,
// least-outstanding (the fewest requests waiting + running, then the lowest KV
// usage), or prefix-affinity (the replica that caches the longest run of the
// prompt's leading KV blocks, unless its load exceeds the least-loaded one's by
// more than a margin). PrefixIndex is the front's copy of what each replica
// caches, kept from the replicas' own cache events (kv::CacheEventLog, read over
// /internal/state), plus the prompts the front has just sent to each (pending,
// until the replica's events cover them). Layer: serve; DpFront calls both.
// Thread-safety: Router::Pick is thread-safe; PrefixIndex is not (the front
// guards it).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "kv/block_hash.h"
#include "kv/cache_event_log.h"

namespace tessera::serve {

enum class RouterPolicy { kRoundRobin, kLeastOutstanding, kPrefixAffinity };
Result<RouterPolicy> RouterPolicyFromName(std::string_view name);
std::string_view RouterPolicyName(RouterPolicy policy);

// One replica as the router sees it when a request arrives.
struct ReplicaView {
  bool up = false;
  int64_t in_flight = 0;  // the front's requests on it now
  // Its scheduler's requests (waiting + running) and KV usage in [0, 1] at the
  // last poll: they include other fronts' requests on a shared replica.
  int64_t reported_requests = 0;
  double kv_usage = 0;
  int64_t matched_blocks = 0;  // the request's leading blocks it caches (prefix-affinity)
};

// Requests on a replica (the larger of the front's count and the replica's own,
// which lags by a poll) plus its KV usage as a fraction: the tie-breaker.
double ReplicaLoad(const ReplicaView& replica);

class Router {
 public:
  // load_margin: prefix-affinity sends a request to its longest match only while
  // that replica's load is at most the least-loaded one's + load_margin.
  Router(RouterPolicy policy, double load_margin);

  // The replica to send a request to, or -1 when none is up. Ties go to the next
  // replica in turn (so equal replicas share a burst evenly).
  int Pick(std::span<const ReplicaView> replicas);
  RouterPolicy policy() const { return policy_; }

 private:
  int LeastLoaded(std::span<const ReplicaView> replicas, uint64_t turn) const;

  const RouterPolicy policy_;
  const double load_margin_;
  std::atomic<uint64_t> turn_{0};
};

// The chained hashes of the full blocks of `tokens`, as a replica's scheduler
// registers them (kv::HashBlock from its root, block_size tokens each).
std::vector<kv::BlockHash> PromptBlockHashes(const kv::BlockHash& root, int64_t block_size,
                                             std::span<const int32_t> tokens);

class PrefixIndex {
 public:
  explicit PrefixIndex(int num_replicas);

  // A batch read from the replica's cache event log (a snapshot replaces all).
  void Apply(int replica, const kv::CacheEventBatch& batch);
  // Forgets what the replica caches (it went down; a restarted one starts empty).
  void Clear(int replica);
  // The front sent a prompt with these blocks to the replica: count them as its
  // own for ttl_ns (by then its events say whether it kept them).
  void AddPending(int replica, std::span<const kv::BlockHash> blocks, int64_t now_ns,
                  int64_t ttl_ns);
  // How many of `blocks` from the first on the replica caches (or has pending).
  int64_t MatchedBlocks(int replica, std::span<const kv::BlockHash> blocks, int64_t now_ns) const;
  size_t num_cached(int replica) const;

 private:
  struct Replica {
    std::unordered_set<kv::BlockHash, kv::BlockHashHasher> cached;
    std::unordered_map<kv::BlockHash, int64_t, kv::BlockHashHasher> pending;  // → expiry
  };
  std::vector<Replica> replicas_;
};

}  // namespace tessera::serve
