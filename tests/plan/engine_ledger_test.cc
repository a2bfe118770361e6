// The planner's per-rank prediction held against the engine's own ledger: dense
// and MoE models run under tp/pp layouts (ranks as threads over shared memory,
// the engine's StageRunner and Driver), every rank records its per-step traffic,
// and each step's entries must equal PredictLedger(RankCalls(…, StepPass(…), rank))
// exactly — calls, bytes sent and bytes received per "group/primitive".
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../engine/parallel_harness.h"
#include "engine/driver.h"
#include "engine/stage_runner.h"
#include "kernels/attention.h"
#include "model/shard.h"
#include "parallel/context_shard.h"
#include "plan/presets.h"
#include "plan/shard.h"
#include "plan/traffic.h"

namespace tessera::plan {
namespace {

std::string ModelPath(const std::string& name) {
  return std::string(TESSERA_SHARED_DIR) + "/models/" + name;
}

// Runs `num_sequences` requests (prompts of 1..23 tokens, chunked prefill, so steps
// mix prefilling and decoding sequences) on every rank of tp × pp; returns all
// ranks' reports with their per-step traffic.
std::vector<engine::RankReport> RunEngine(const std::string& path, int tp, int pp,
                                          int num_sequences, bool deterministic, int ep,
                                          int64_t sp) {
  const engine::testing::ThreadedJob job{.tp = tp,
                                         .pp = pp,
                                         .ep = ep,
                                         .sp = sp > 0,
                                         .sp_min_tokens = std::max<int64_t>(sp, 1),
                                         .deterministic = deterministic,
                                         .kv_capacity_tokens = 1024,
                                         .record_traffic = true};
  return engine::testing::RunThreadedJob(
      path, job, [&](engine::StepExecutor& driver, const model::Tokenizer& tokenizer) {
        engine::testing::GenerateAll(driver, tokenizer,
                                     engine::testing::TestRequests(num_sequences, 4),
                                     /*step_tokens=*/8);
      });
}

// One step's measured ledger entries are exactly the predicted ones: the same keys,
// calls, bytes sent and received.
void ExpectLedgerIs(const engine::StepTraffic& step,
                    const std::map<std::string, LedgerEntry>& predicted, const std::string& where) {
  EXPECT_EQ(step.bytes.size(), predicted.size()) << where;
  for (const auto& [key, entry] : predicted) {
    auto it = step.bytes.find(key);
    ASSERT_TRUE(it != step.bytes.end()) << where << ": no " << key;
    EXPECT_EQ(static_cast<int64_t>(it->second.calls), entry.calls) << where << " " << key;
    EXPECT_EQ(static_cast<int64_t>(it->second.bytes_sent), entry.bytes.sent) << where << " " << key;
    EXPECT_EQ(static_cast<int64_t>(it->second.bytes_received), entry.bytes.received)
        << where << " " << key;
  }
}

// sp: 0 = off, N = sequence parallelism on steps of N tokens or more.
void ExpectPredicted(const std::string& file, const char* preset, int tp, int pp,
                     bool deterministic, int ep = 1, int64_t sp = 0) {
  if (!std::filesystem::exists(ModelPath(file))) GTEST_SKIP() << file << " not found";
  const std::vector<engine::RankReport> reports =
      RunEngine(ModelPath(file), tp, pp, 3, deterministic, ep, sp);
  ASSERT_EQ(reports.size(), static_cast<size_t>(tp * pp));
  const ModelShape m = *ModelPreset(preset);
  Workload w;
  w.act_dtype = *ParseDType("f32");
  if (deterministic) w.allreduce_algo = AllReduceAlgo::kDeterministic;
  const Parallelism p{.tp = tp, .pp = pp, .ep = ep, .sp = sp};
  const std::string layout = p.ToString();
  int64_t steps = 0, mixed = 0;
  for (const engine::RankReport& report : reports) {
    ASSERT_FALSE(report.traffic.empty()) << layout << " rank " << report.rank;
    for (const engine::StepTraffic& step : report.traffic) {
      ++steps;
      if (!step.decode && step.sequences > 1) ++mixed;
      Pass pass = StepPass(step.sequences, step.tokens, step.logit_rows);
      // EP: the combine's bytes follow the routing, which the run measured.
      if (ep > 1) pass.expert_rows = ExpertRows{step.ep_rows_sent, step.ep_rows_received};
      const auto predicted =
          PredictLedger(RankCalls(m, *ClusterPreset("8xh100"), w, p, pass, report.rank));
      const std::string where =
          layout + " rank " + std::to_string(report.rank) + " step " +
          std::to_string(step.step_id) + " (" + std::to_string(step.sequences) + " seqs, " +
          std::to_string(step.tokens) + " tokens, " + std::to_string(step.logit_rows) + " rows)";
      ExpectLedgerIs(step, predicted, where);
    }
  }
  EXPECT_GT(steps, 0);
  EXPECT_GT(mixed, 0) << "no step mixed several sequences";
}

TEST(EngineLedgerTest, DenseLayoutsMatchThePrediction) {
  ExpectPredicted("stories260K.gguf", "stories260k", 2, 1, true);
  ExpectPredicted("stories260K.gguf", "stories260k", 1, 2, true);
  ExpectPredicted("stories260K.gguf", "stories260k", 2, 2, true);
  ExpectPredicted("stories260K.gguf", "stories260k", 4, 1, false);  // comm's choice
}

// Sequence parallelism: reduce-scatters and all-gathers per 256-row chunk, the
// head rows' all-reduce, pieces between stages; with sp >= 8 the short steps stay
// plain tensor parallel.
TEST(EngineLedgerTest, SequenceParallelLayoutsMatchThePrediction) {
  ExpectPredicted("stories260K.gguf", "stories260k", 2, 1, true, 1, 1);
  ExpectPredicted("stories260K.gguf", "stories260k", 4, 1, true, 1, 1);
  ExpectPredicted("stories260K.gguf", "stories260k", 2, 2, true, 1, 1);
  ExpectPredicted("stories260K.gguf", "stories260k", 2, 2, true, 1, 8);
}

TEST(EngineLedgerTest, MoeLayoutsMatchThePrediction) {
  ExpectPredicted("stories260K-moe4x2.gguf", "stories260k-moe4x2", 2, 1, true);
  ExpectPredicted("stories260K-moe4x2.gguf", "stories260k-moe4x2", 2, 2, false);
}

TEST(EngineLedgerTest, ExpertParallelLayoutsMatchThePrediction) {
  ExpectPredicted("stories260K-moe4x2.gguf", "stories260k-moe4x2", 2, 1, true, 2);
  ExpectPredicted("stories260K-moe4x2.gguf", "stories260k-moe4x2", 4, 1, true, 2);
  ExpectPredicted("stories260K-moe4x2.gguf", "stories260k-moe4x2", 2, 2, true, 2);
}

// Context parallelism: a whole-prompt prefill split by span (the K/V rows' and the
// logit rows' all-gathers) and decode steps whose span partials are all-gathered,
// for sequences of one length (the steps the planner models under cp: uniform ones).
void ExpectContextPredicted(int tp, int cp, int pp, int64_t prompt_tokens, int64_t num_sequences) {
  const std::string file = "stories260K.gguf";
  if (!std::filesystem::exists(ModelPath(file))) GTEST_SKIP() << file << " not found";
  std::vector<engine::RequestParams> requests =
      engine::testing::TestRequests(static_cast<int>(num_sequences), 5);
  for (engine::RequestParams& r : requests) {
    r.prompt.clear();
    for (int64_t t = 0; t < prompt_tokens; ++t) r.prompt.push_back((5 + 31 * t) % 500);
  }
  const engine::testing::ThreadedJob job{.tp = tp,
                                         .pp = pp,
                                         .cp = cp,
                                         .kv_capacity_tokens = 1024,
                                         .max_step_tokens = 2048,
                                         .record_traffic = true};
  const std::vector<engine::RankReport> reports = engine::testing::RunThreadedJob(
      ModelPath(file), job, [&](engine::StepExecutor& driver, const model::Tokenizer& tokenizer) {
        engine::testing::GenerateAll(driver, tokenizer, requests,
                                     /*step_tokens=*/prompt_tokens * num_sequences);
      });
  ASSERT_EQ(reports.size(), static_cast<size_t>(tp * cp * pp));
  const ModelShape m = *ModelPreset("stories260k");
  Workload w;
  w.act_dtype = *ParseDType("f32");
  w.allreduce_algo = AllReduceAlgo::kDeterministic;
  const Parallelism p{.tp = tp, .pp = pp, .cp = cp};
  int64_t prefills = 0, decodes = 0;
  for (const engine::RankReport& report : reports) {
    for (const engine::StepTraffic& step : report.traffic) {
      ASSERT_EQ(step.tokens % step.sequences, 0);
      Pass pass;
      pass.phase = step.decode ? Phase::kDecode : Phase::kPrefill;
      pass.num_seqs = step.sequences;
      pass.tokens_per_seq = step.tokens / step.sequences;
      pass.context = step.context / step.sequences;
      ASSERT_TRUE(step.decode || step.context == 0) << "a later prefill chunk";
      (step.decode ? decodes : prefills) += 1;
      const auto predicted =
          PredictLedger(RankCalls(m, *ClusterPreset("8xh100"), w, p, pass, report.rank));
      const std::string where = p.ToString() + " rank " + std::to_string(report.rank) + " step " +
                                std::to_string(step.step_id);
      ExpectLedgerIs(step, predicted, where);
    }
  }
  EXPECT_GT(prefills, 0);
  EXPECT_GT(decodes, 0);
}

TEST(EngineLedgerTest, ContextParallelLayoutsMatchThePrediction) {
  ExpectContextPredicted(1, 2, 1, 600, 1);  // spans 0, 2 on rank 0; 1 on rank 1
  ExpectContextPredicted(1, 3, 1, 300, 2);  // a rank with no rows
  ExpectContextPredicted(2, 2, 1, 520, 2);
  ExpectContextPredicted(1, 2, 2, 600, 1);
}

// The planner's span arithmetic is the engine's.
TEST(EngineLedgerTest, PlannerSpansAreTheEngines) {
  EXPECT_EQ(kCpSpanTokens, kernels::kAttentionSpan);
  for (int cp = 1; cp <= 5; ++cp) {
    for (int64_t k = 0; k < 40; ++k) {
      EXPECT_EQ(CpSpanOwner(k, cp), parallel::ContextSpanOwner(k, cp)) << k << " " << cp;
      EXPECT_EQ(CpSpansOnRank(k, cp, k % cp), parallel::ContextSpansOnRank(k, k % cp, cp));
    }
  }
}

}  // namespace
}  // namespace tessera::plan
