// Prefix caching in the scheduler: a request whose prompt starts with cached full
// blocks gets exactly the tokens and logits it gets computed cold (cache off, in
// another batch and chunking), whether the cached part came from another request's
// prompt, from a conversation's generated tokens, or from its own blocks before a
// preemption; the cache stays inside the KV pool, evicts under pressure, reports
// its hits, and changes no limit. On ../shared/models/stories260K.gguf (skipped
// without it).
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "test_models.h"

namespace tessera::engine {
namespace {

constexpr int64_t kBlockSize = 16;  // testing::TestCache's

using testing::Concat;
using testing::ExpectSameGenerations;
using testing::Greedy;
using testing::Tokens;

using PrefixCacheTest = testing::SharedModelTest;

// Later requests reuse blocks that earlier ones computed in other batches and
// other chunkings (a 24-token budget, two sequences at a time).
TEST_F(PrefixCacheTest, SharedPrefixFromCacheIsBitIdentical) {
  const std::vector<int32_t> p = Tokens(70, 1), b = Tokens(40, 2);
  const std::vector<RequestParams> ps = {Greedy(Concat(p, Tokens(5, 3)), 12),
                                         Greedy(Concat(b, Tokens(9, 4)), 10),
                                         Greedy(Concat(p, Tokens(20, 5)), 9),
                                         Greedy(std::vector<int32_t>(p.begin(), p.begin() + 64), 8),
                                         Greedy(Concat(b, Tokens(3, 6)), 11),
                                         Greedy(Concat(p, Tokens(5, 3)), 12),
                                         Greedy(Concat(p, Tokens(1, 7)), 7)};
  testing::LocalEngine engine(*loaded_, 1024);
  SchedulerStats stats;
  const std::vector<testing::Generation> warm = testing::GenerateWith(
      engine.driver, tokenizer(), ps,
      {.max_num_batched_tokens = 24, .max_num_seqs = 2, .max_waiting = 16}, &stats);
  ExpectSameGenerations(Cold(ps), warm);

  int64_t cached = 0;
  for (const testing::Generation& g : warm) cached += g.result.cached_tokens;
  EXPECT_EQ(warm[0].result.cached_tokens, 0);
  EXPECT_EQ(warm[1].result.cached_tokens, 0);
  // A prompt of exactly 4 full cached blocks recomputes its last block (one token
  // at least is computed so that its logits exist).
  EXPECT_EQ(warm[3].result.cached_tokens, 3 * kBlockSize);
  // The same prompt again: every full block but the one holding its last token.
  const int64_t len5 = static_cast<int64_t>(ps[5].prompt.size());
  EXPECT_EQ(warm[5].result.cached_tokens, (len5 - 1) / kBlockSize * kBlockSize);
  EXPECT_EQ(warm[6].result.cached_tokens, 4 * kBlockSize);
  EXPECT_TRUE(stats.prefix_cache_enabled);
  EXPECT_EQ(stats.preemptions_total, 0);
  EXPECT_EQ(stats.prefix_cache_queries_total, static_cast<int64_t>(ps.size()));
  EXPECT_EQ(stats.prefix_cache_hit_tokens_total, cached);
  EXPECT_EQ(stats.prefix_cache_hit_blocks_total, cached / kBlockSize);
  int64_t queried = 0;
  for (const RequestParams& r : ps) queried += static_cast<int64_t>(r.prompt.size());
  EXPECT_EQ(stats.prefix_cache_query_tokens_total, queried);
  EXPECT_GT(stats.kv_blocks_cached, 0);
  EXPECT_EQ(stats.kv_blocks_evictable, stats.kv_blocks_cached);  // nothing runs now
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

// A conversation: turn 2 resends turn 1's prompt and answer; the answer's full
// blocks were registered as they were computed, so they are hits too.
TEST_F(PrefixCacheTest, NextTurnReusesTheAnswersBlocks) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.max_num_batched_tokens = 32, .max_num_seqs = 4, .max_waiting = 16});
  Status run_status;
  std::thread loop([&] { run_status = scheduler.Run(); });
  auto serve = [&](const RequestParams& p) {
    testing::Generation g;
    std::promise<void> done;
    auto handle = scheduler.Submit(p, {.on_token =
                                           [&g](const TokenEvent& e) {
                                             g.tokens.push_back(e.token);
                                             g.logits.insert(g.logits.end(), e.logits.begin(),
                                                             e.logits.end());
                                           },
                                       .on_done =
                                           [&g, &done](const RequestResult& r) {
                                             g.result = r;
                                             done.set_value();
                                           }});
    EXPECT_TRUE(handle.ok()) << handle.status().ToString();
    done.get_future().wait();
    return g;
  };
  const RequestParams turn1 = Greedy(Tokens(40, 11), 30);
  const testing::Generation first = serve(turn1);
  const RequestParams turn2 =
      Greedy(Concat(Concat(turn1.prompt, first.tokens), Tokens(10, 12)), 10);
  const testing::Generation second = serve(turn2);
  scheduler.Stop(/*cancel_in_flight=*/false);
  loop.join();
  ASSERT_TRUE(run_status.ok()) << run_status.ToString();
  // 40 prompt + 29 generated tokens had their K/V computed: 4 full blocks, the
  // last of them half answer.
  EXPECT_EQ(second.result.cached_tokens, 4 * kBlockSize);
  ExpectSameGenerations(Cold({turn1, turn2}), {first, second});
}

// A pool too small for the running sequences: preemptions and evictions happen,
// the cache never holds more blocks than the pool, a preempted sequence takes its
// own cached blocks back, and every output is still the cold one.
TEST_F(PrefixCacheTest, EvictionAndPreemptionInASmallPool) {
  std::vector<RequestParams> ps;
  for (int i = 0; i < 8; ++i) {
    // Two families of shared prefixes and distinct tails.
    ps.push_back(Greedy(Concat(Tokens(33, 20 + i % 2), Tokens(4 + i, 30 + i)), 30));
  }
  testing::LocalEngine engine(*loaded_, 8 * kBlockSize);
  SchedulerStats stats;
  const std::vector<testing::Generation> warm = testing::GenerateWith(
      engine.driver, tokenizer(), ps,
      {.max_num_batched_tokens = 16, .max_num_seqs = 3, .max_waiting = 16}, &stats);
  ExpectSameGenerations(Cold(ps), warm);
  EXPECT_EQ(stats.kv_blocks_total, 8);
  EXPECT_GT(stats.preemptions_total, 0);
  EXPECT_GT(stats.prefix_cache_evictions_total, 0);
  EXPECT_GT(stats.prefix_cache_hit_blocks_total, 0);
  EXPECT_LE(stats.kv_blocks_cached, stats.kv_blocks_total);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.kv_blocks_evictable, stats.kv_blocks_cached);
}

// Requests that arrive together with one system prompt: the first computes it,
// the others wait a step and take its blocks from the cache instead of computing
// them in the same step; a prefix shorter than prefix_wait_min_tokens, or the wait
// turned off, is computed by each.
TEST_F(PrefixCacheTest, WaitsForBlocksARunningRequestIsComputing) {
  const std::vector<int32_t> system = Tokens(100, 40);  // 6 full blocks and 4 tokens
  std::vector<RequestParams> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(Greedy(Concat(system, Tokens(7 + i, 50 + i)), 6));
  const std::vector<testing::Generation> cold = Cold(ps);
  for (const int64_t min_tokens : {int64_t{32}, int64_t{0}, int64_t{6 * kBlockSize + 1}}) {
    SCOPED_TRACE("prefix_wait_min_tokens " + std::to_string(min_tokens));
    testing::LocalEngine engine(*loaded_, 1024);
    SchedulerStats stats;
    const std::vector<testing::Generation> warm =
        testing::GenerateWith(engine.driver, tokenizer(), ps,
                              {.max_num_batched_tokens = 512,
                               .max_num_seqs = 4,
                               .max_waiting = 4,
                               .prefix_wait_min_tokens = min_tokens},
                              &stats);
    ExpectSameGenerations(cold, warm);
    EXPECT_EQ(warm[0].result.cached_tokens, 0);
    const bool waits = min_tokens == 32;
    for (size_t i = 1; i < ps.size(); ++i) {
      EXPECT_EQ(warm[i].result.cached_tokens, waits ? 6 * kBlockSize : 0) << "request " << i;
    }
    // The three waited one step each, in the first step's admission; behind the
    // first of them the others wait too (FIFO), so the count is 1.
    EXPECT_EQ(stats.prefix_cache_waits_total, waits ? 1 : 0);
  }
}

TEST_F(PrefixCacheTest, OffMeansNoHits) {
  const std::vector<int32_t> p = Tokens(50, 1);
  const std::vector<RequestParams> ps = {Greedy(Concat(p, Tokens(3, 2)), 5),
                                         Greedy(Concat(p, Tokens(3, 3)), 5)};
  testing::LocalEngine engine(*loaded_, 1024);
  SchedulerStats stats;
  const std::vector<testing::Generation> warm =
      testing::GenerateWith(engine.driver, tokenizer(), ps,
                            {.max_num_batched_tokens = 64,
                             .max_num_seqs = 1,
                             .max_waiting = 4,
                             .enable_prefix_cache = false},
                            &stats);
  ExpectSameGenerations(Cold(ps), warm);
  EXPECT_FALSE(stats.prefix_cache_enabled);
  EXPECT_EQ(warm[1].result.cached_tokens, 0);
  EXPECT_EQ(stats.prefix_cache_queries_total, 0);
  EXPECT_EQ(stats.prefix_cache_hit_tokens_total, 0);
  EXPECT_EQ(stats.kv_blocks_cached, 0);
}

// The limits are the pool's, cache or not: a sequence longer than the pool is
// refused as before, and one that needs the whole pool evicts every cached block.
TEST_F(PrefixCacheTest, LimitsAreThePools) {
  testing::LocalEngine engine(*loaded_, 6 * kBlockSize);
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.max_num_batched_tokens = 32, .max_num_seqs = 2, .max_waiting = 16});
  EXPECT_EQ(scheduler.max_model_len(), 6 * kBlockSize);
  std::vector<testing::Generation> out(4);
  std::vector<RequestParams> ps = {Greedy(Tokens(40, 1), 8), Greedy(Tokens(40, 2), 8),
                                   Greedy(Tokens(80, 3), 16), Greedy(Tokens(40, 1), 8)};
  for (size_t i = 0; i < ps.size(); ++i) {
    testing::Generation& g = out[i];
    ASSERT_TRUE(scheduler
                    .Submit(ps[i], {.on_token =
                                        [&g](const TokenEvent& e) {
                                          g.tokens.push_back(e.token);
                                          g.logits.insert(g.logits.end(), e.logits.begin(),
                                                          e.logits.end());
                                        },
                                    .on_done = [&g](const RequestResult& r) { g.result = r; }})
                    .ok());
  }
  auto too_long = scheduler.Submit(Greedy(Tokens(6 * kBlockSize, 4), 1), {});
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  auto no_room = scheduler.Submit(Greedy(Tokens(90, 4), 7), {});
  EXPECT_EQ(no_room.status().code(), StatusCode::kInvalidArgument);
  scheduler.Stop(/*cancel_in_flight=*/false);
  ASSERT_TRUE(scheduler.Run().ok());
  ExpectSameGenerations(Cold(ps), out);
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_LE(stats.kv_blocks_cached, 6);
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

}  // namespace
}  // namespace tessera::engine
