// The scheduler under data-parallel attention (an executor with attention_ranks()
// = 2): requests spread over the ranks, every sequence's blocks lie in its rank's
// share of the pool at every step (growing, guessing, after preemption), a prompt
// goes to the rank that caches its prefix, each rank caches on its own, a
// sequence is limited to one rank's share, and every output is the one-rank
// output. The executor here is one real rank whose cache holds both shares, block
// ids passed through unchanged: only the scheduler's partitioning is under test.
// On ../shared/models/stories260K.gguf (skipped without it).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "test_models.h"

// A namespace of its own: the suite's files share one unity translation unit.
namespace tessera::engine::dp_attention_test {
namespace {

constexpr int64_t kBlockSize = 16;  // testing::TestCache's

using testing::Concat;
using testing::ExpectSameGenerations;
using testing::Greedy;
using testing::Tokens;

// Poses as data-parallel attention over `ranks` ranks in front of `inner`, whose
// num_kv_blocks() the ranks share equally. Fails the test when an entry's block
// table does not lie whole in one rank's range, or lies in another rank's than in
// the sequence's last step without it being recomputed (preempted and admitted
// again); records each step's entries' ranks, and the recomputations by the rank
// the sequence left. Sequences are told apart by their block table's address: a
// new request at a finished one's address starts below where that one ended, so
// it counts as a recomputation.
class AttentionRanksExecutor final : public StepExecutor {
 public:
  AttentionRanksExecutor(StepExecutor& inner, int32_t ranks)
      : restarts_from(static_cast<size_t>(ranks), 0), inner_(inner), ranks_(ranks) {}

  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  int32_t attention_ranks() const override { return ranks_; }
  std::string kv_cache_salt() const override { return inner_.kv_cache_salt(); }
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override {
    const int32_t per_rank = num_kv_blocks() / ranks_;
    std::vector<int32_t>& ranks = step_ranks.emplace_back();
    for (const StepEntry& e : entries) {
      const std::span<const kv::BlockId> blocks = e.block_table->blocks();
      EXPECT_FALSE(blocks.empty());
      if (blocks.empty()) continue;
      const int32_t rank = blocks[0] / per_rank;
      for (kv::BlockId block : blocks) {
        if (block / per_rank != rank) {
          ++split_tables;
          ADD_FAILURE() << "a sequence's blocks "
                        << ::testing::PrintToString(
                               std::vector<kv::BlockId>(blocks.begin(), blocks.end()))
                        << " span two ranks' ranges of " << per_rank;
          break;
        }
      }
      ranks.push_back(rank);
      auto [last, first_step] = last_.try_emplace(e.block_table, Last{rank, 0});
      if (!first_step && e.start_position < last->second.end) {
        ++restarts_from[static_cast<size_t>(last->second.rank)];
      } else if (!first_step && rank != last->second.rank) {
        ADD_FAILURE() << "a sequence moved from rank " << last->second.rank << " to " << rank
                      << " at position " << e.start_position;
      }
      // A speculating entry keeps its pending token at least.
      const int64_t kept = e.all_logits ? 1 : static_cast<int64_t>(e.new_tokens.size());
      last->second = {rank, e.start_position + kept};
    }
    return inner_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override { return inner_.Collect(); }

  std::vector<std::vector<int32_t>> step_ranks;  // [steps][entries]
  int64_t split_tables = 0;
  std::vector<int64_t> restarts_from;  // [ranks]

 private:
  struct Last {
    int32_t rank;
    int64_t end;  // the position after its last step's kept tokens
  };
  StepExecutor& inner_;
  int32_t ranks_;
  std::unordered_map<const kv::BlockTable*, Last> last_;
};

// Callbacks that fill `g`; `then` (if set) runs after on_done.
RequestCallbacks Into(testing::Generation& g, std::function<void()> then = {}) {
  return {.on_token =
              [&g](const TokenEvent& e) {
                g.tokens.push_back(e.token);
                g.logits.insert(g.logits.end(), e.logits.begin(), e.logits.end());
              },
          .on_done =
              [&g, then](const RequestResult& r) {
                g.result = r;
                if (then) then();
              }};
}

using DpAttentionSchedulerTest = testing::SharedModelTest;

// Admitted together, requests alternate between the ranks (equal load: the
// lowest rank, then the other); each rank's share bounds max_model_len.
TEST_F(DpAttentionSchedulerTest, RequestsSpreadOverTheRanksAndMatchOneRank) {
  std::vector<RequestParams> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(Greedy(Tokens(40 + i, i), 8 + i));
  testing::LocalEngine engine(*loaded_, 2048);  // 128 blocks: 64 a rank
  AttentionRanksExecutor dp(engine.driver, 2);
  SchedulerStats stats;
  const std::vector<testing::Generation> out =
      testing::GenerateWith(dp, tokenizer(), ps, {.max_num_seqs = 4, .max_waiting = 4}, &stats);
  ExpectSameGenerations(Cold(ps), out);
  ASSERT_FALSE(dp.step_ranks.empty());
  EXPECT_EQ(dp.step_ranks[0], (std::vector<int32_t>{0, 1, 0, 1}));
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(out[i].result.attention_rank, static_cast<int32_t>(i % 2)) << "request " << i;
  }
  EXPECT_EQ(dp.split_tables, 0);
  EXPECT_EQ(stats.kv_blocks_total, 128);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.running_by_attention_rank, (std::vector<int64_t>{0, 0}));
}

// A pool of 2 × 6 blocks for six requests of up to 4 blocks each: preemptions on
// both ranks, and every sequence's blocks stay in one rank's range as it grows,
// guesses (speculative decoding) included, and when it is admitted again; the
// outputs are still the one-rank ones.
TEST_F(DpAttentionSchedulerTest, SmallPoolPreemptsWithinARankAndMatchesOneRank) {
  std::vector<RequestParams> ps;
  for (int i = 0; i < 6; ++i) {
    // Repetitive prompts, so that the n-gram proposer guesses.
    std::vector<int32_t> prompt = Tokens(4 + i, 10 + i);
    prompt = Concat(Concat(prompt, prompt), prompt);
    ps.push_back(Greedy(prompt, 44));
  }
  const std::vector<testing::Generation> want = Cold(ps);
  for (const bool speculate : {false, true}) {
    SCOPED_TRACE(speculate ? "n-gram guesses" : "no guesses");
    testing::LocalEngine engine(*loaded_, 12 * kBlockSize);
    AttentionRanksExecutor dp(engine.driver, 2);
    SchedulerOptions options{.max_num_batched_tokens = 64, .max_num_seqs = 6, .max_waiting = 6};
    if (speculate) {
      options.proposer = std::make_shared<NgramProposer>();
      options.spec_tokens = 3;
    }
    SchedulerStats stats;
    const std::vector<testing::Generation> out =
        testing::GenerateWith(dp, tokenizer(), ps, options, &stats);
    ExpectSameGenerations(want, out);
    EXPECT_EQ(dp.split_tables, 0);
    EXPECT_GT(stats.preemptions_total, 0);
    if (speculate) {
      EXPECT_GT(stats.spec_accepted_tokens_total, 0);
    }
    EXPECT_EQ(stats.kv_blocks_used, 0);
    bool used[2] = {false, false};
    for (const std::vector<int32_t>& step : dp.step_ranks) {
      for (int32_t rank : step) used[rank] = true;
    }
    EXPECT_TRUE(used[0] && used[1]);
    EXPECT_GT(dp.restarts_from[0] + dp.restarts_from[1], 0);
  }
}

// Rank 0 runs out of blocks while rank 1 has room: the sequence that needs a
// block preempts the newest idle one of its own rank, never rank 1's newer one
// (whose blocks would be of no use to it).
TEST_F(DpAttentionSchedulerTest, PreemptsOnlyOnTheRankThatRunsOut) {
  // Admitted in one step to ranks 0, 1, 0 (equal load and free blocks: the lowest)
  // and 1. Rank 0's two grow to 4 blocks each, 8 > 6; rank 1's to 3 and 2, and 2
  // and 4 when rank 0's second moves there.
  const std::vector<RequestParams> ps = {Greedy(Tokens(40, 1), 20), Greedy(Tokens(40, 2), 4),
                                         Greedy(Tokens(40, 3), 20), Greedy(Tokens(10, 4), 20)};
  testing::LocalEngine engine(*loaded_, 12 * kBlockSize);
  AttentionRanksExecutor dp(engine.driver, 2);
  SchedulerStats stats;
  const std::vector<testing::Generation> out = testing::GenerateWith(
      dp, tokenizer(), ps, {.max_num_batched_tokens = 256, .max_num_seqs = 4, .max_waiting = 4},
      &stats);
  ExpectSameGenerations(Cold(ps), out);
  ASSERT_FALSE(dp.step_ranks.empty());
  ASSERT_EQ(dp.step_ranks[0], (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_GT(stats.preemptions_total, 0);
  EXPECT_EQ(dp.restarts_from[0], stats.preemptions_total);
  EXPECT_EQ(dp.restarts_from[1], 0);
  EXPECT_EQ(out[3].result.attention_rank, 1);
  EXPECT_EQ(dp.split_tables, 0);
}

// A finished request left its prompt's blocks cached on rank 0; a later request
// with the same prefix goes there for the hits although rank 0 is busier (one
// running, rank 1 idle).
TEST_F(DpAttentionSchedulerTest, PrefixAffinityBeatsLoad) {
  const std::vector<int32_t> prefix = Tokens(70, 1);  // 4 full blocks and 6 tokens
  const std::vector<RequestParams> ps = {Greedy(Concat(prefix, Tokens(5, 2)), 4),
                                         Greedy(Tokens(30, 7), 40),  // busy on rank 0
                                         Greedy(Concat(prefix, Tokens(9, 3)), 4)};
  testing::LocalEngine engine(*loaded_, 2048);
  AttentionRanksExecutor dp(engine.driver, 2);
  Scheduler scheduler(dp, tokenizer(), {.max_num_seqs = 4, .max_waiting = 4});
  std::vector<testing::Generation> out(3);
  // The first, alone; once it is done the busy one; at the busy one's first token the last.
  RequestCallbacks last = Into(out[2], [&] { scheduler.Stop(/*cancel_in_flight=*/false); });
  RequestCallbacks busy = Into(out[1]);
  busy.on_token = [&, record = busy.on_token](const TokenEvent& e) {
    record(e);
    if (out[1].tokens.size() == 1) {
      ASSERT_TRUE(scheduler.Submit(ps[2], last).ok());
    }
  };
  ASSERT_TRUE(
      scheduler
          .Submit(ps[0], Into(out[0], [&] { ASSERT_TRUE(scheduler.Submit(ps[1], busy).ok()); }))
          .ok());
  ASSERT_TRUE(scheduler.Run().ok());
  ExpectSameGenerations(Cold(ps), out);
  EXPECT_EQ(out[0].result.attention_rank, 0);
  EXPECT_EQ(out[0].result.cached_tokens, 0);
  ASSERT_EQ(out[1].result.attention_rank, 0) << "equal load and free blocks: the lowest rank";
  EXPECT_EQ(out[2].result.attention_rank, 0);
  EXPECT_EQ(out[2].result.cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(dp.split_tables, 0);
}

// A rank that caches the prefix but has no room for the rest now loses to one that
// has: the request runs on rank 1 at once, computing the prefix there, instead of
// waiting on rank 0 (and holding up the queue behind it) until its blocks free up.
TEST_F(DpAttentionSchedulerTest, AffinityYieldsToARankWithRoom) {
  const std::vector<int32_t> prefix = Tokens(70, 1);          // 4 full blocks and 6 tokens
  const std::vector<RequestParams> ps = {Greedy(prefix, 50),  // grows to 8 blocks of rank 0
                                         Greedy(Concat(prefix, Tokens(40, 3)), 4)};
  testing::LocalEngine engine(*loaded_, 256);  // 8 blocks a rank
  AttentionRanksExecutor dp(engine.driver, 2);
  Scheduler scheduler(dp, tokenizer(), {.max_num_seqs = 4, .max_waiting = 4});
  std::vector<testing::Generation> out(2);
  // The second arrives when the first holds 7 of rank 0's 8 blocks; it needs 3
  // beyond the 4 rank 0 caches.
  RequestCallbacks first = Into(out[0]);
  first.on_token = [&, record = first.on_token](const TokenEvent& e) {
    record(e);
    if (out[0].tokens.size() == 30) {
      ASSERT_TRUE(scheduler.Submit(ps[1], Into(out[1])).ok());
      scheduler.Stop(/*cancel_in_flight=*/false);
    }
  };
  ASSERT_TRUE(scheduler.Submit(ps[0], first).ok());
  ASSERT_TRUE(scheduler.Run().ok());
  ExpectSameGenerations(Cold(ps), out);
  EXPECT_EQ(out[0].result.attention_rank, 0);
  EXPECT_EQ(out[1].result.attention_rank, 1) << "rank 0 caches the prefix but has no room";
  EXPECT_EQ(out[1].result.cached_tokens, 0);
  // It ran beside the first, not after it.
  EXPECT_LT(out[1].result.timing.queue_s, 1.0);
  EXPECT_EQ(dp.split_tables, 0);
}

// The same prompt twice at once: the second goes to the idle rank 1 and computes
// it there too (a block cached on rank 0 is no use to rank 1), so both ranks cache
// it; a later request with that prefix, while rank 0 is busy, gets its hits on
// rank 1.
TEST_F(DpAttentionSchedulerTest, EachRankCachesTheSamePromptOnItsOwn) {
  const std::vector<int32_t> prompt = Concat(Tokens(70, 1), Tokens(5, 2));  // 4 full blocks
  const std::vector<RequestParams> ps = {Greedy(prompt, 4), Greedy(prompt, 4),
                                         Greedy(Tokens(30, 7), 40),  // busy on rank 0
                                         Greedy(Concat(Tokens(70, 1), Tokens(9, 3)), 4)};
  testing::LocalEngine engine(*loaded_, 2048);
  AttentionRanksExecutor dp(engine.driver, 2);
  Scheduler scheduler(dp, tokenizer(), {.max_num_seqs = 4, .max_waiting = 4});
  std::vector<testing::Generation> out(4);
  int done = 0;
  int64_t cached_blocks = -1;  // when the busy one starts
  RequestCallbacks last = Into(out[3], [&] { scheduler.Stop(/*cancel_in_flight=*/false); });
  RequestCallbacks busy = Into(out[2]);
  busy.on_token = [&, record = busy.on_token](const TokenEvent& e) {
    record(e);
    if (out[2].tokens.size() != 1) return;
    cached_blocks = scheduler.Stats().kv_blocks_cached;
    ASSERT_TRUE(scheduler.Submit(ps[3], last).ok());
  };
  auto then = [&] {
    if (++done == 2) {
      ASSERT_TRUE(scheduler.Submit(ps[2], busy).ok());
    }
  };
  ASSERT_TRUE(scheduler.Submit(ps[0], Into(out[0], then)).ok());
  ASSERT_TRUE(scheduler.Submit(ps[1], Into(out[1], then)).ok());
  ASSERT_TRUE(scheduler.Run().ok());
  ExpectSameGenerations(Cold(ps), out);
  EXPECT_EQ(out[0].result.attention_rank, 0);
  EXPECT_EQ(out[1].result.attention_rank, 1);
  EXPECT_EQ(out[0].result.cached_tokens, 0);
  EXPECT_EQ(out[1].result.cached_tokens, 0);
  // Each registered its 4 full blocks (78 of 79 tokens computed): 8 on one pool
  // (a single rank keeps one block per hash: 4).
  EXPECT_EQ(cached_blocks, 8);
  ASSERT_EQ(out[2].result.attention_rank, 0);
  EXPECT_EQ(out[3].result.attention_rank, 1);
  EXPECT_EQ(out[3].result.cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(dp.split_tables, 0);
}

// A sequence holds blocks of one rank only: max_model_len defaults to one rank's
// share and may not exceed it; a prompt longer is refused, while two sequences
// that each fill a rank's share run side by side without preemption.
TEST_F(DpAttentionSchedulerTest, OneRanksShareBoundsASequence) {
  testing::LocalEngine engine(*loaded_, 12 * kBlockSize);  // 6 blocks a rank
  AttentionRanksExecutor dp(engine.driver, 2);
  const Status too_long = ValidateSchedulerOptions({.max_model_len = 12 * kBlockSize}, dp);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("exceeds the KV cache of 96 tokens that one of the 2 "
                                    "data-parallel attention ranks holds"),
            std::string::npos)
      << too_long.ToString();
  EXPECT_TRUE(ValidateSchedulerOptions({.max_model_len = 6 * kBlockSize}, dp).ok());

  Scheduler scheduler(dp, tokenizer(), {.max_num_batched_tokens = 256, .max_num_seqs = 2});
  EXPECT_EQ(scheduler.max_model_len(), 6 * kBlockSize);
  const auto refused = scheduler.Submit(Greedy(Tokens(100, 1), 4), {});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("exceed the model length of 96 tokens"),
            std::string::npos)
      << refused.status().ToString();

  const std::vector<RequestParams> ps = {Greedy(Tokens(90, 2), 6), Greedy(Tokens(90, 3), 6)};
  std::vector<testing::Generation> out(2);
  for (size_t i = 0; i < ps.size(); ++i) ASSERT_TRUE(scheduler.Submit(ps[i], Into(out[i])).ok());
  scheduler.Stop(/*cancel_in_flight=*/false);
  ASSERT_TRUE(scheduler.Run().ok());
  ExpectSameGenerations(Cold(ps), out);
  for (const testing::Generation& g : out) {
    EXPECT_EQ(g.result.reason, FinishReason::kLength);
    EXPECT_EQ(g.result.completion_tokens, 6);
  }
  EXPECT_NE(out[0].result.attention_rank, out[1].result.attention_rank);
  EXPECT_EQ(scheduler.Stats().preemptions_total, 0);
  EXPECT_EQ(dp.split_tables, 0);
}

// A pool the ranks cannot share equally is refused.
TEST_F(DpAttentionSchedulerTest, UnequalSharesAreRefused) {
  testing::LocalEngine engine(*loaded_, 13 * kBlockSize);
  AttentionRanksExecutor dp(engine.driver, 2);
  const Status status = ValidateSchedulerOptions({}, dp);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("data-parallel attention over 2 ranks"), std::string::npos)
      << status.ToString();
}

}  // namespace
}  // namespace tessera::engine::dp_attention_test
