// The data-parallel router's decisions (round-robin, least-outstanding,
// prefix-affinity with its load margin), the front's prefix index kept from cache
// events, and the replica state's JSON round trip.
#include "serve/router.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "serve/replica_state.h"

namespace tessera::serve {
namespace {

ReplicaView Up(int64_t in_flight, int64_t matched = 0) {
  return {.up = true, .in_flight = in_flight, .matched_blocks = matched};
}

TEST(RouterTest, PolicyNames) {
  for (RouterPolicy p : {RouterPolicy::kRoundRobin, RouterPolicy::kLeastOutstanding,
                         RouterPolicy::kPrefixAffinity}) {
    Result<RouterPolicy> back = RouterPolicyFromName(RouterPolicyName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  Result<RouterPolicy> bad = RouterPolicyFromName("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("round-robin"), std::string::npos);
}

TEST(RouterTest, RoundRobinSkipsDownReplicas) {
  Router router(RouterPolicy::kRoundRobin, 0);
  std::vector<ReplicaView> r = {Up(0), {.up = false}, Up(5)};
  std::vector<int> picks;
  for (int i = 0; i < 4; ++i) picks.push_back(router.Pick(r));
  EXPECT_EQ(picks, (std::vector<int>{0, 2, 2, 0}));
  for (ReplicaView& v : r) v.up = false;
  EXPECT_EQ(router.Pick(r), -1);
  EXPECT_EQ(router.Pick({}), -1);
}

TEST(RouterTest, LeastOutstandingUsesTheLargerCountThenKvUsage) {
  Router router(RouterPolicy::kLeastOutstanding, 0);
  // The replica reports more requests than the front sent it (another front's):
  // its own count wins.
  std::vector<ReplicaView> r = {Up(1), Up(2)};
  r[0].reported_requests = 5;
  EXPECT_EQ(router.Pick(r), 1);
  // Equal requests: the lower KV usage.
  r = {Up(2), Up(2)};
  r[0].kv_usage = 0.9;
  r[1].kv_usage = 0.1;
  EXPECT_EQ(router.Pick(r), 1);
  EXPECT_EQ(router.Pick(r), 1);
  // A tie alternates (a burst is shared evenly).
  r = {Up(0), Up(0)};
  const int a = router.Pick(r), b = router.Pick(r);
  EXPECT_NE(a, b);
}

TEST(RouterTest, PrefixAffinityLongestMatchWithinTheMargin) {
  Router router(RouterPolicy::kPrefixAffinity, /*load_margin=*/4);
  // Longest match wins although it is busier…
  std::vector<ReplicaView> r = {Up(0, 2), Up(3, 60), Up(1, 10)};
  EXPECT_EQ(router.Pick(r), 1);
  // …until it exceeds the least-loaded replica by more than the margin.
  r[1].in_flight = 5;
  EXPECT_EQ(router.Pick(r), 0);
  // Cached nowhere: the least loaded.
  r = {Up(3), Up(1), Up(2)};
  EXPECT_EQ(router.Pick(r), 1);
  // A replica that is down is never picked, however much it caches.
  r = {Up(0, 1), {.up = false, .matched_blocks = 64}};
  EXPECT_EQ(router.Pick(r), 0);
  // Equal matches: the less loaded of the two.
  r = {Up(3, 8), Up(1, 8), Up(0, 0)};
  EXPECT_EQ(router.Pick(r), 1);
}

kv::CacheEventBatch Events(std::vector<kv::CacheEvent> events) {
  kv::CacheEventBatch batch;
  batch.events = std::move(events);
  return batch;
}

TEST(PrefixIndexTest, MatchesLeadingBlocksFromEventsAndPending) {
  const kv::BlockHash root = kv::RootBlockHash("model");
  std::vector<int32_t> tokens(16 * 4 + 5);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::vector<kv::BlockHash> h = PromptBlockHashes(root, 16, tokens);
  ASSERT_EQ(h.size(), 4u);  // full blocks only
  // Chained: a block's hash depends on everything before it.
  std::vector<int32_t> other = tokens;
  other[0] = 999;
  EXPECT_NE(PromptBlockHashes(root, 16, other)[3], h[3]);

  PrefixIndex index(2);
  index.Apply(0, Events({{true, h[0]}, {true, h[1]}, {true, h[3]}}));
  EXPECT_EQ(index.MatchedBlocks(0, h, 0), 2);  // h[2] missing: the run stops there
  EXPECT_EQ(index.MatchedBlocks(1, h, 0), 0);
  index.Apply(0, Events({{true, h[2]}}));
  EXPECT_EQ(index.MatchedBlocks(0, h, 0), 4);
  index.Apply(0, Events({{false, h[1]}}));  // evicted
  EXPECT_EQ(index.MatchedBlocks(0, h, 0), 1);
  EXPECT_EQ(index.num_cached(0), 3u);

  // A snapshot replaces everything.
  kv::CacheEventBatch snapshot;
  snapshot.snapshot = true;
  snapshot.cached = {h[0]};
  index.Apply(0, snapshot);
  EXPECT_EQ(index.num_cached(0), 1u);
  EXPECT_EQ(index.MatchedBlocks(0, h, 0), 1);

  // Pending: a prompt just sent counts until it expires (or events confirm it).
  index.AddPending(1, h, /*now_ns=*/100, /*ttl_ns=*/50);
  EXPECT_EQ(index.MatchedBlocks(1, h, 120), 4);
  EXPECT_EQ(index.MatchedBlocks(1, h, 151), 0);
  index.Apply(1, Events({{true, h[0]}, {true, h[1]}}));
  EXPECT_EQ(index.MatchedBlocks(1, h, 151), 2);
  index.Clear(1);
  EXPECT_EQ(index.MatchedBlocks(1, h, 0), 0);
}

TEST(ReplicaStateTest, JsonRoundTripAndBadInput) {
  ReplicaState s{.instance = "abc-1",
                 .waiting = 3,
                 .running = 2,
                 .kv_blocks_used = 10,
                 .kv_blocks_total = 64,
                 .recovering = true,
                 .prefix_cache = true,
                 .block_size = 16,
                 .root = kv::RootBlockHash("r")};
  s.cache.events = {{true, kv::RootBlockHash("a")}, {false, kv::RootBlockHash("b")}};
  s.cache.next = 42;
  Result<ReplicaState> back = ReplicaStateFromJson(ReplicaStateToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->instance, "abc-1");
  EXPECT_EQ(back->waiting, 3);
  EXPECT_EQ(back->running, 2);
  EXPECT_EQ(back->kv_blocks_total, 64);
  EXPECT_TRUE(back->recovering);
  EXPECT_EQ(back->root, s.root);
  EXPECT_EQ(back->cache.next, 42u);
  ASSERT_EQ(back->cache.events.size(), 2u);
  EXPECT_TRUE(back->cache.events[0].stored);
  EXPECT_EQ(back->cache.events[1].hash, kv::RootBlockHash("b"));
  EXPECT_FALSE(back->cache.snapshot);

  EXPECT_FALSE(ReplicaStateFromJson("[]").ok());
  EXPECT_FALSE(ReplicaStateFromJson("{\"instance\":1}").ok());
  EXPECT_FALSE(BlockHashFromHex("xyz").ok());
  EXPECT_FALSE(BlockHashFromHex(std::string(32, 'G')).ok());
  Result<kv::BlockHash> hash = BlockHashFromHex(BlockHashToHex(s.root));
  ASSERT_TRUE(hash.ok());
  EXPECT_EQ(*hash, s.root);
}

}  // namespace
}  // namespace tessera::serve
