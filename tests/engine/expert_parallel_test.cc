// Expert parallelism against the single-rank run: every --ep layout the models
// allow (ep alone, tp × ep, pp × ep) must give logits bit-identical to one rank's,
// on the Mixtral-style (llama arch) path — the shared 4-expert model and a
// synthetic Q8_0 model with 8 experts, top-2 — and the qwen2moe shared-expert
// path; bad --ep requests are refused before loading, naming the reason. Ranks run
// as threads of this process over shared memory (parallel_harness.h).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/driver.h"
#include "engine/loaded_model.h"
#include "engine/stage_runner.h"
#include "model/moe_ep.h"
#include "model/shard.h"
#include "model/synth.h"
#include "parallel_harness.h"
#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::ExpectSameRecording;
using testing::HaveModel;
using testing::ModelPath;
using testing::Record;
using testing::Recording;

Recording RunJob(const std::string& path, const testing::ThreadedJob& job, int num_sequences,
                 int64_t num_tokens, int64_t step_tokens) {
  Recording run;
  run.reports = testing::RunThreadedJob(
      path, job, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        Record(testing::GenerateAll(driver, tokenizer,
                                    testing::TestRequests(num_sequences, num_tokens), step_tokens),
               run);
      });
  return run;
}

struct EpLayout {
  int tp, ep, pp;
};

std::string Name(const EpLayout& l) {
  return "tp" + std::to_string(l.tp) + " ep" + std::to_string(l.ep) + " pp" + std::to_string(l.pp);
}

// Each stage's routed (token, choice) rows were computed exactly once, spread over
// its ranks (with replicas, whichever holder took each).
void ExpectEachRoutedRowComputedOnce(const std::vector<RankReport>& reports, int pp, int ep,
                                     const std::string& what) {
  for (int stage = 0; stage < pp; ++stage) {
    int64_t routed = 0, computed = 0;
    for (const RankReport& r : reports) {
      if (r.stage != stage) continue;
      computed += r.expert_rows_computed;
      if (r.tp_rank % ep == 0) {
        for (int64_t v : r.expert_rows_total) routed += v;
      }
    }
    EXPECT_GT(routed, 0) << what;
    EXPECT_EQ(computed, routed) << what << " stage " << stage;
  }
}

// One rank (tp = pp = ep = 1) against each layout, batch by batch.
void CheckEpLayouts(const std::string& path, const std::vector<EpLayout>& layouts,
                    const std::vector<int>& batches, int64_t num_tokens, int64_t chunk) {
  for (int batch : batches) {
    const Recording single = RunJob(path, {}, batch, num_tokens, chunk);
    ASSERT_EQ(single.logits.size(), static_cast<size_t>(batch));
    for (const EpLayout& l : layouts) {
      const std::string what = Name(l) + " batch " + std::to_string(batch);
      const Recording ep =
          RunJob(path, {.tp = l.tp, .pp = l.pp, .ep = l.ep}, batch, num_tokens, chunk);
      ASSERT_EQ(ep.reports.size(), static_cast<size_t>(l.tp * l.pp)) << what;
      ExpectSameRecording(single, ep, what);
      // The load: every rank of one EP group counts the same rows, and they sum
      // to the group's tokens × top-k × the stage's layers.
      for (const RankReport& r : ep.reports) {
        for (const RankReport& q : ep.reports) {
          if (q.rank == r.rank - r.tp_rank % l.ep) {
            EXPECT_EQ(r.expert_rows_total, q.expert_rows_total) << what << " rank " << r.rank;
          }
        }
        int64_t rows = 0;
        for (int64_t v : r.expert_rows_total) rows += v;
        EXPECT_GT(rows, 0) << what << " rank " << r.rank;
      }
    }
  }
}

TEST(ExpertParallelTest, SharedMoeModelEveryLayoutIsBitIdentical) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  CheckEpLayouts(ModelPath("stories260K-moe4x2.gguf"), {{2, 2, 1}, {4, 2, 1}, {4, 4, 1}, {2, 2, 2}},
                 {1, 4}, 5, 6);
}

// Replicated and moved experts (parallel/expert_placement.h): a token routed to an
// expert with several copies is computed by one of them, so the ranks' loads move
// while the logits stay one rank's; every routed row is computed exactly once.
TEST(ExpertParallelTest, ReplicatedExpertsAreBitIdentical) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K-moe4x2.gguf");
  struct Case {
    int tp, ep, pp, redundant;
    std::vector<std::vector<int>> holders;
  };
  const std::vector<Case> cases = {
      {2, 2, 1, 1, {{0}, {0, 1}, {1, 0}, {1}}},        // the middle experts on both ranks
      {2, 2, 2, 1, {{0}, {0, 1}, {1, 0}, {1}}},        // ... under pp
      {2, 2, 1, 2, {{0, 1}, {1, 0}, {0, 1}, {1, 0}}},  // every expert on both ranks
      {2, 2, 1, 0, {{1}, {1}, {0}, {0}}},              // homes swapped
      {4, 4, 1, 1, {{0, 2}, {1, 3}, {2, 0}, {3, 1}}},  // ep 4, a copy each
  };
  for (int batch : {1, 4}) {
    const Recording single = RunJob(path, {}, batch, 5, 6);
    for (const Case& c : cases) {
      const parallel::ExpertPlacement placement{.holders = c.holders};
      const std::string what = "tp" + std::to_string(c.tp) + " ep" + std::to_string(c.ep) + " pp" +
                               std::to_string(c.pp) + " " + placement.ToJson() + " batch " +
                               std::to_string(batch);
      const Recording ep = RunJob(path,
                                  {.tp = c.tp,
                                   .pp = c.pp,
                                   .ep = c.ep,
                                   .ep_redundant = c.redundant,
                                   .expert_placement = placement},
                                  batch, 5, 6);
      ExpectSameRecording(single, ep, what);
      ExpectEachRoutedRowComputedOnce(ep.reports, c.pp, c.ep, what);
    }
  }
}

// The driver's executor, re-placing the experts (Driver::SetExpertPlacement) after
// every `every` steps, cycling through `placements`: a serving engine's live
// re-placement between steps. One step in flight at a time (a re-placement needs
// the pipeline drained).
class ReplacingExecutor final : public StepExecutor {
 public:
  ReplacingExecutor(Driver& driver, std::vector<parallel::ExpertPlacement> placements, int every)
      : driver_(driver), placements_(std::move(placements)), every_(every) {}

  int64_t vocab_size() const override { return driver_.vocab_size(); }
  int32_t num_kv_blocks() const override { return driver_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return driver_.kv_block_size(); }
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override {
    return driver_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override {
    TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, driver_.Collect());
    if (++steps_ % every_ == 0) {
      const parallel::ExpertPlacement& next = placements_[replaced_++ % placements_.size()];
      TESSERA_RETURN_IF_ERROR(driver_.SetExpertPlacement(next).status());
    }
    return logits;
  }
  int replaced() const { return replaced_; }

 private:
  Driver& driver_;
  std::vector<parallel::ExpertPlacement> placements_;
  int every_;
  int steps_ = 0;
  int replaced_ = 0;
};

// Experts moved between steps of a running job — copies added, dropped, homes
// swapped — never change a logit: every layout matches one rank's, bit for bit,
// and every routed row is still computed exactly once.
void CheckLivePlacements(const std::string& path, const testing::ThreadedJob& job,
                         const std::vector<parallel::ExpertPlacement>& placements) {
  const int batch = 3;
  const Recording single = RunJob(path, {}, batch, 6, 4);
  Recording live;
  int replaced = 0;
  live.reports = testing::RunThreadedJob(
      path, job, [&](StepExecutor& executor, const model::Tokenizer& tokenizer) {
        auto* driver = dynamic_cast<Driver*>(&executor);
        ASSERT_NE(driver, nullptr);
        ReplacingExecutor replacing(*driver, placements, 2);
        Record(testing::GenerateAll(replacing, tokenizer, testing::TestRequests(batch, 6), 4),
               live);
        replaced = replacing.replaced();
      });
  const std::string what = "tp" + std::to_string(job.tp) + " ep" + std::to_string(job.ep) + " pp" +
                           std::to_string(job.pp);
  EXPECT_GE(replaced, static_cast<int>(placements.size())) << what;
  ExpectSameRecording(single, live, what);
  ExpectEachRoutedRowComputedOnce(live.reports, job.pp, job.ep, what);
}

TEST(ExpertParallelTest, LivePlacementChangesAreBitIdentical) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K-moe4x2.gguf");  // f32: experts stay views
  const std::vector<parallel::ExpertPlacement> two_ranks = {
      {.holders = {{0}, {0, 1}, {1, 0}, {1}}},  // the middle experts copied
      {.holders = {{0, 1}, {0}, {1}, {1, 0}}},  // the outer ones instead
      {.holders = {{1}, {1}, {0}, {0}}},        // homes swapped, no copies
      {.holders = {{0}, {0}, {1}, {1}}},        // back home
  };
  CheckLivePlacements(path, {.tp = 2, .ep = 2, .ep_redundant = 1}, two_ranks);
  CheckLivePlacements(path, {.tp = 2, .pp = 2, .ep = 2, .ep_redundant = 1}, two_ranks);
  CheckLivePlacements(
      path, {.tp = 4, .ep = 4, .ep_redundant = 1},
      {{.holders = {{0, 3}, {1}, {2}, {3}}}, {.holders = {{0}, {1, 2}, {2, 0}, {3, 1}}}});
}

// The same with experts the matmul reads interleaved: they live in the rank's slots
// (model/expert_slots.h), and a new copy is written over a dropped one's slot.
TEST(ExpertParallelTest, LivePlacementMovesInterleavedSlots) {
  const std::string path = ::testing::TempDir() + "/ep_live_q8_moe8.gguf";
  model::SynthOptions o = testing::EightExpertSynth();
  o.seed = 12;  // other weights than the layout tests'
  ASSERT_TRUE(model::WriteSynthModel(o, path).ok());
  const parallel::ExpertHolders home = {{0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}};
  const parallel::ExpertHolders copies = {{0, 1}, {0}, {0}, {0, 1}, {1}, {1, 0}, {1}, {1, 0}};
  const std::vector<parallel::ExpertPlacement> placements = {
      {.holders = {{0}, {0, 1}, {0}, {0}, {1, 0}, {1}, {1}, {1}}},
      {.holders = copies},
      {.layers = {home, copies}},  // a table per layer: layer 0's copies go home
      {.layers = {copies, {{0}, {0, 1}, {0}, {0}, {1}, {1}, {1, 0}, {1}}}},
      {.holders = home}};
  CheckLivePlacements(path, {.tp = 2, .ep = 2, .ep_redundant = 2}, placements);
  CheckLivePlacements(path, {.tp = 2, .pp = 2, .ep = 2, .ep_redundant = 2}, placements);
  std::filesystem::remove(path);
}

// A placement the slots cannot hold is refused by the driver before any rank sees
// it, and the job goes on with the experts where they were.
TEST(ExpertParallelTest, PlacementBeyondTheSlotsIsRefusedAndChangesNothing) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K-moe4x2.gguf");
  const Recording single = RunJob(path, {}, 2, 4, 4);
  Recording run;
  run.reports = testing::RunThreadedJob(
      path, {.tp = 2, .ep = 2, .ep_redundant = 1},
      [&](StepExecutor& executor, const model::Tokenizer& tokenizer) {
        auto* driver = dynamic_cast<Driver*>(&executor);
        ASSERT_NE(driver, nullptr);
        // Rank 0 would hold all four experts: one slot too many.
        auto refused = driver->SetExpertPlacement({.holders = {{0}, {0, 1}, {1, 0}, {1, 0}}});
        ASSERT_FALSE(refused.ok());
        EXPECT_NE(refused.status().message().find("EP rank 0"), std::string::npos)
            << refused.status().ToString();
        // Not an EP model's shape: the count of experts.
        refused = driver->SetExpertPlacement({.holders = {{0}, {1}}});
        ASSERT_FALSE(refused.ok());
        Record(testing::GenerateAll(executor, tokenizer, testing::TestRequests(2, 4), 4), run);
      });
  ExpectSameRecording(single, run, "after the refusals");
}

TEST(ExpertParallelTest, Q8EightExpertsIsBitIdentical) {
  const std::string path = ::testing::TempDir() + "/ep_synth_q8_moe8.gguf";
  ASSERT_TRUE(model::WriteSynthModel(testing::EightExpertSynth(), path).ok());
  CheckEpLayouts(path, {{2, 2, 1}, {4, 4, 1}, {2, 2, 2}}, {3}, 4, 8);
  std::filesystem::remove(path);
}

TEST(ExpertParallelTest, Qwen2MoeSharedExpertIsBitIdentical) {
  const std::string path = ::testing::TempDir() + "/ep_synth_qwen2moe.gguf";
  ASSERT_TRUE(model::WriteSynthModel(testing::Qwen2MoeSynth(), path).ok());
  auto file = model::GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto config = model::ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->arch, "qwen2moe");
  EXPECT_EQ(config->shared_expert_ffn_dim, 256);
  CheckEpLayouts(path, {{2, 2, 1}, {2, 2, 2}}, {1, 3}, 4, 8);
  std::filesystem::remove(path);
}

// The ledger's ep bytes are exactly the rows that crossed ranks (rows × dim × 4),
// and a rank's load adds up to its experts' rows.
TEST(ExpertParallelTest, CombineBytesAreTheRowsThatCrossRanks) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const Recording run = RunJob(ModelPath("stories260K-moe4x2.gguf"),
                               {.tp = 2, .ep = 2, .record_traffic = true}, 3, 4, 8);
  ASSERT_EQ(run.reports.size(), 2u);
  const int64_t dim = 64;
  int64_t crossed = 0;
  for (const RankReport& r : run.reports) {
    ASSERT_FALSE(r.traffic.empty());
    for (const StepTraffic& t : r.traffic) {
      auto it = t.bytes.find("ep/all_to_allv");
      ASSERT_TRUE(it != t.bytes.end());
      EXPECT_EQ(static_cast<int64_t>(it->second.bytes_sent), t.ep_rows_sent * dim * 4);
      EXPECT_EQ(static_cast<int64_t>(it->second.bytes_received), t.ep_rows_received * dim * 4);
      crossed += t.ep_rows_sent;
    }
  }
  EXPECT_GT(crossed, 0);
}

TEST(ExpertParallelTest, TokenChunksFollowThePlanner) {
  // ⌈T/P⌉ for the first T % P ranks (plan::ChunkElems).
  EXPECT_EQ(model::ChunkOf(5, 2, 0).begin, 0);
  EXPECT_EQ(model::ChunkOf(5, 2, 0).end, 3);
  EXPECT_EQ(model::ChunkOf(5, 2, 1).begin, 3);
  EXPECT_EQ(model::ChunkOf(5, 2, 1).end, 5);
  EXPECT_EQ(model::ChunkOf(1, 4, 3).size(), 0);
  EXPECT_EQ(model::ChunkOf(1, 4, 0).size(), 1);
}

TEST(ExpertParallelTest, BadRequestsAreRefusedBeforeLoading) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  auto refused = [](const std::string& name, int tp, int ep, const std::string& needle) {
    auto file = model::GgufFile::Open(ModelPath(name));
    ASSERT_TRUE(file.ok());
    auto config = model::ModelConfigFromGguf(*file);
    ASSERT_TRUE(config.ok());
    auto plan = model::PartitionForModel(*file, *config, {.tp = tp, .ep = ep});
    ASSERT_FALSE(plan.ok()) << name << " tp" << tp << " ep" << ep;
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().ToString();
  };
  refused("stories260K-moe4x2.gguf", 2, 4, "--ep (4) must divide --tp (2)");
  refused("stories260K-moe4x2.gguf", 8, 8, "--ep 8 must divide the model's 4 experts");
  refused("stories260K.gguf", 2, 2, "--ep 2 needs a mixture-of-experts model");
  auto file = model::GgufFile::Open(ModelPath("stories260K-moe4x2.gguf"));
  ASSERT_TRUE(file.ok());
  auto config = model::ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok());
  // Placements that do not fit the model or the slots.
  auto refused_placement = [&](const parallel::PartitionRequest& request,
                               const std::string& needle) {
    auto plan = model::PartitionForModel(*file, *config, request);
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().ToString();
  };
  using Holders = std::vector<std::vector<int>>;
  refused_placement({.tp = 2, .ep = 2, .expert_placement = {Holders{{0}, {0}, {1}}}},
                    "lists 3 experts; the model has 4");
  refused_placement({.tp = 2, .ep = 2, .expert_placement = {Holders{{0}, {0}, {1}, {2}}}},
                    "expert 3 is placed on EP rank 2, outside [0, 2)");
  refused_placement({.tp = 2, .ep = 2, .expert_placement = {Holders{{0}, {0}, {1}, {}}}},
                    "expert 3 has no rank holding it");
  refused_placement({.tp = 2, .ep = 2, .expert_placement = {Holders{{0}, {0, 0}, {1}, {1}}}},
                    "expert 1 is placed twice on EP rank 0");
  refused_placement({.tp = 2, .ep = 2, .expert_placement = {Holders{{0}, {0}, {0, 1}, {1}}}},
                    "EP rank 0 would hold 3 experts; it has 2 slots");
  refused_placement({.tp = 2, .ep_redundant = 1}, "they need --ep 2 or more");
  auto ok = model::PartitionForModel(*file, *config, {.tp = 4, .ep = 2});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->ToString(), "tp4 ep2 pp1");
  EXPECT_EQ(ok->EpRankOf(3), 1);
  EXPECT_EQ(ok->EpGroupOf(3), 1);
}

}  // namespace
}  // namespace tessera::engine
