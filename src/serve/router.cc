#include "serve/router.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace tessera::serve {

Result<RouterPolicy> RouterPolicyFromName(std::string_view name) {
  if (name == "round-robin") return RouterPolicy::kRoundRobin;
  if (name == "least-outstanding") return RouterPolicy::kLeastOutstanding;
  if (name == "prefix-affinity") return RouterPolicy::kPrefixAffinity;
  return InvalidArgumentError(
      "--router must be round-robin, least-outstanding or "
      "prefix-affinity, not '" +
      std::string(name) + "'");
}

std::string_view RouterPolicyName(RouterPolicy policy) {
  switch (policy) {
    case RouterPolicy::kRoundRobin:
      return "round-robin";
    case RouterPolicy::kLeastOutstanding:
      return "least-outstanding";
    case RouterPolicy::kPrefixAffinity:
      return "prefix-affinity";
  }
  return "?";
}

double ReplicaLoad(const ReplicaView& replica) {
  return static_cast<double>(std::max(replica.in_flight, replica.reported_requests)) +
         std::clamp(replica.kv_usage, 0.0, 1.0);
}

Router::Router(RouterPolicy policy, double load_margin)
    : policy_(policy), load_margin_(load_margin) {}

int Router::LeastLoaded(std::span<const ReplicaView> replicas, uint64_t turn) const {
  const size_t n = replicas.size();
  int best = -1;
  for (size_t k = 0; k < n; ++k) {  // from this turn's replica on: ties rotate
    const size_t i = (turn + k) % n;
    if (!replicas[i].up) continue;
    if (best < 0 || ReplicaLoad(replicas[i]) < ReplicaLoad(replicas[static_cast<size_t>(best)])) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

int Router::Pick(std::span<const ReplicaView> replicas) {
  if (replicas.empty()) return -1;
  const uint64_t turn = turn_.fetch_add(1);
  switch (policy_) {
    case RouterPolicy::kRoundRobin:
      for (size_t k = 0; k < replicas.size(); ++k) {
        const size_t i = (turn + k) % replicas.size();
        if (replicas[i].up) return static_cast<int>(i);
      }
      return -1;
    case RouterPolicy::kLeastOutstanding:
      return LeastLoaded(replicas, turn);
    case RouterPolicy::kPrefixAffinity: {
      const int least = LeastLoaded(replicas, turn);
      if (least < 0) return -1;
      int best = -1;
      for (size_t k = 0; k < replicas.size(); ++k) {
        const size_t i = (turn + k) % replicas.size();
        const ReplicaView& r = replicas[i];
        if (!r.up || r.matched_blocks == 0) continue;
        if (best < 0 || r.matched_blocks > replicas[static_cast<size_t>(best)].matched_blocks ||
            (r.matched_blocks == replicas[static_cast<size_t>(best)].matched_blocks &&
             ReplicaLoad(r) < ReplicaLoad(replicas[static_cast<size_t>(best)]))) {
          best = static_cast<int>(i);
        }
      }
      if (best < 0) return least;  // cached nowhere: spread by load
      const double excess = ReplicaLoad(replicas[static_cast<size_t>(best)]) -
                            ReplicaLoad(replicas[static_cast<size_t>(least)]);
      return excess > load_margin_ ? least : best;
    }
  }
  return -1;
}

std::vector<kv::BlockHash> PromptBlockHashes(const kv::BlockHash& root, int64_t block_size,
                                             std::span<const int32_t> tokens) {
  std::vector<kv::BlockHash> out;
  if (block_size <= 0) return out;
  const size_t bs = static_cast<size_t>(block_size);
  kv::BlockHash parent = root;
  for (size_t start = 0; start + bs <= tokens.size(); start += bs) {
    parent = kv::HashBlock(parent, tokens.subspan(start, bs));
    out.push_back(parent);
  }
  return out;
}

PrefixIndex::PrefixIndex(int num_replicas) : replicas_(static_cast<size_t>(num_replicas)) {}

void PrefixIndex::Apply(int replica, const kv::CacheEventBatch& batch) {
  Replica& r = replicas_.at(static_cast<size_t>(replica));
  if (batch.snapshot) {
    r.cached.clear();
    r.cached.insert(batch.cached.begin(), batch.cached.end());
  }
  for (const kv::CacheEvent& e : batch.events) {
    if (e.stored) {
      r.cached.insert(e.hash);
      r.pending.erase(e.hash);  // confirmed
    } else {
      r.cached.erase(e.hash);
    }
  }
}

void PrefixIndex::Clear(int replica) {
  Replica& r = replicas_.at(static_cast<size_t>(replica));
  r.cached.clear();
  r.pending.clear();
}

void PrefixIndex::AddPending(int replica, std::span<const kv::BlockHash> blocks, int64_t now_ns,
                             int64_t ttl_ns) {
  Replica& r = replicas_.at(static_cast<size_t>(replica));
  if (r.pending.size() > 2 * blocks.size() + 4096) {  // now and then, drop the expired
    std::erase_if(r.pending, [&](const auto& entry) { return entry.second < now_ns; });
  }
  for (const kv::BlockHash& h : blocks) {
    if (!r.cached.contains(h)) r.pending[h] = now_ns + ttl_ns;
  }
}

int64_t PrefixIndex::MatchedBlocks(int replica, std::span<const kv::BlockHash> blocks,
                                   int64_t now_ns) const {
  const Replica& r = replicas_.at(static_cast<size_t>(replica));
  int64_t n = 0;
  for (const kv::BlockHash& h : blocks) {
    if (!r.cached.contains(h)) {
      auto it = r.pending.find(h);
      if (it == r.pending.end() || it->second < now_ns) break;
    }
    ++n;
  }
  return n;
}

size_t PrefixIndex::num_cached(int replica) const {
  return replicas_.at(static_cast<size_t>(replica)).cached.size();
}

}  // namespace tessera::serve
