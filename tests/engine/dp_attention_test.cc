// Data-parallel attention (--ep N --dp-attention) against the single-rank run: each
// rank runs its own sequences' attention over its own KV cache and the MoE layers
// exchange rows between the ranks (model/moe_dp.h). Every request's tokens and
// logits must be bit-identical to one rank's — with one rank idle (padding steps),
// uneven batches, and one rank's requests all finishing early — on the Mixtral-style
// path (the shared 4-expert model, a Q8_0 synth with 8 experts) and the qwen2moe
// shared-expert path. A peer announcing rows the rank cannot compute is an error,
// not a crash. Ranks run as threads of this process (parallel_harness.h).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/moe_dp.h"
#include "model/synth.h"
#include "parallel/expert_placement.h"
#include "parallel_harness.h"
#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::ExpectSameRecording;
using testing::HaveModel;
using testing::ModelPath;
using testing::Record;
using testing::Recording;

Recording RunRequests(const std::string& path, const testing::ThreadedJob& job,
                      const std::vector<RequestParams>& requests, int64_t step_tokens) {
  Recording run;
  run.reports = testing::RunThreadedJob(
      path, job, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        Record(testing::GenerateAll(driver, tokenizer, requests, step_tokens), run);
      });
  return run;
}

// The rows each rank's own tokens routed (under dp attention a rank counts its own).
std::vector<int64_t> RoutedRowsByRank(const std::vector<RankReport>& reports) {
  std::vector<int64_t> rows;
  for (const RankReport& r : reports) {
    int64_t n = 0;
    for (int64_t v : r.expert_rows_total) n += v;
    rows.push_back(n);
  }
  return rows;
}

// dp ranks against one rank on `requests`: bit-identical, every routed row
// computed exactly once over the ranks, and with at least `busy_ranks` ranks
// running sequences of their own.
void CheckAgainstOneRank(const std::string& path, int dp,
                         const std::vector<RequestParams>& requests, int64_t step_tokens,
                         int busy_ranks, const std::string& what) {
  const Recording single = RunRequests(path, {}, requests, step_tokens);
  ASSERT_EQ(single.logits.size(), requests.size()) << what;
  const Recording run = RunRequests(path, {.ep = dp, .dp = dp}, requests, step_tokens);
  ASSERT_EQ(run.reports.size(), static_cast<size_t>(dp)) << what;
  ExpectSameRecording(single, run, what);
  int64_t routed = 0, computed = 0;
  int busy = 0;
  for (size_t r = 0; r < run.reports.size(); ++r) {
    const int64_t own = RoutedRowsByRank(run.reports)[r];
    routed += own;
    busy += own > 0 ? 1 : 0;
    computed += run.reports[r].expert_rows_computed;
  }
  EXPECT_GT(routed, 0) << what;
  EXPECT_EQ(computed, routed) << what << ": every routed row computed once";
  EXPECT_GE(busy, busy_ranks) << what << ": ranks that ran sequences of their own";
}

TEST(DpAttentionTest, EveryBatchIsBitIdenticalToOneRank) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K-moe4x2.gguf");
  // One request: the other rank runs padding steps throughout.
  CheckAgainstOneRank(path, 2, testing::TestRequests(1, 6), 8, 1, "dp2, 1 request");
  // Uneven: 3 requests over 2 ranks, prompts chunked.
  CheckAgainstOneRank(path, 2, testing::TestRequests(3, 6), 8, 2, "dp2, 3 requests");
  CheckAgainstOneRank(path, 4, testing::TestRequests(5, 5), 16, 4, "dp4, 5 requests");
}

// Half the requests stop after one token: once they finish, their rank has no
// sequence left and pads every step while the others decode on.
TEST(DpAttentionTest, ARanksRequestsFinishingEarlyLeaveItPadding) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  std::vector<RequestParams> requests = testing::TestRequests(4, 10);
  for (size_t i = 0; i < requests.size(); i += 2) requests[i].max_tokens = 1;
  CheckAgainstOneRank(ModelPath("stories260K-moe4x2.gguf"), 2, requests, 64, 2,
                      "dp2, half finishing early");
  std::vector<RequestParams> staggered = testing::TestRequests(6, 12);
  for (size_t i = 0; i < staggered.size(); ++i) staggered[i].max_tokens = 1 + 2 * i;
  CheckAgainstOneRank(ModelPath("stories260K-moe4x2.gguf"), 2, staggered, 64, 2,
                      "dp2, staggered ends");
}

TEST(DpAttentionTest, Q8EightExpertsAndQwen2MoeAreBitIdentical) {
  const std::string q8 = ::testing::TempDir() + "/dpa_synth_q8_moe8.gguf";
  ASSERT_TRUE(model::WriteSynthModel(testing::EightExpertSynth(), q8).ok());
  CheckAgainstOneRank(q8, 2, testing::TestRequests(3, 4), 8, 2, "q8 8 experts dp2");
  std::filesystem::remove(q8);
  const std::string qwen = ::testing::TempDir() + "/dpa_synth_qwen2moe.gguf";
  ASSERT_TRUE(model::WriteSynthModel(testing::Qwen2MoeSynth(), qwen).ok());
  CheckAgainstOneRank(qwen, 2, testing::TestRequests(3, 4), 8, 2, "qwen2moe dp2");
  std::filesystem::remove(qwen);
}

// The ledger's ep bytes are the rows that crossed ranks: each row's input went out
// (dispatch) and its output came back (combine), dim floats each way, plus one
// count per expert and peer per MoE layer.
TEST(DpAttentionTest, ExchangeBytesAreTheRowsThatCrossRanks) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const Recording run =
      RunRequests(ModelPath("stories260K-moe4x2.gguf"), {.ep = 2, .dp = 2, .record_traffic = true},
                  testing::TestRequests(3, 4), 8);
  ASSERT_EQ(run.reports.size(), 2u);
  const int64_t dim = 64, experts = 4, moe_layers = 5;
  int64_t crossed = 0;
  for (const RankReport& r : run.reports) {
    ASSERT_FALSE(r.traffic.empty());
    for (const StepTraffic& t : r.traffic) {
      auto rows = t.bytes.find("ep/all_to_allv");
      ASSERT_TRUE(rows != t.bytes.end());
      const int64_t both = (t.ep_rows_sent + t.ep_rows_received) * dim * 4;
      EXPECT_EQ(static_cast<int64_t>(rows->second.bytes_sent), both);
      EXPECT_EQ(static_cast<int64_t>(rows->second.bytes_received), both);
      auto counts = t.bytes.find("ep/all_to_all");
      ASSERT_TRUE(counts != t.bytes.end());
      EXPECT_EQ(static_cast<int64_t>(counts->second.bytes_sent), moe_layers * experts * 8);
      crossed += t.ep_rows_sent;
    }
  }
  EXPECT_GT(crossed, 0);
}

// What the rank's peers announce is checked before anything is sized from it.
class LyingCounts final : public model::TensorParallelOps {
 public:
  explicit LyingCounts(int64_t rows) : rows_(rows) {}
  Status AllReduceSum(std::span<float>, const model::WeightMatrix*) override {
    return Status::Ok();
  }
  Status ExpertAllToAllCounts(std::span<const int64_t>, std::span<int64_t> recv) override {
    std::fill(recv.begin(), recv.end(), 0);
    recv[4 + 2] = rows_;  // from rank 1: rows of expert 2
    return Status::Ok();
  }
  Status ExpertAllToAllv(std::span<const float>, std::span<const size_t>, std::span<float>,
                         std::span<const size_t>, int64_t) override {
    ADD_FAILURE() << "rows exchanged after bad counts";
    return Status::Ok();
  }

 private:
  int64_t rows_;
};

TEST(DpAttentionTest, APeersBadCountsAreAnError) {
  model::ModelConfig c;
  c.dim = 8;
  c.num_experts = 4;
  c.num_experts_used = 2;
  model::ShardLayout layout;
  layout.layers = {0, 1};
  layout.ep_size = 2;
  layout.ep_rank = 0;
  layout.dp_attention = true;
  layout.expert_placement = parallel::ContiguousPlacement(4, 2);
  layout.held_experts = {{0, 1}};
  model::LlamaLayerWeights w;
  model::LlamaScratch s;
  ThreadPool pool(1);
  // A padding step (no token of its own) still checks what arrives: expert 2 lives
  // on rank 1, so rank 1 cannot send rows of it here.
  LyingCounts not_held(3);
  Status status = model::MoeBlockDataParallel(c, layout, 0, w, 0, s, pool, not_held);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("does not hold it"), std::string::npos) << status.ToString();
  layout.held_experts = {{0, 1, 2}};  // a copy of expert 2 here: now too many rows
  LyingCounts huge(int64_t{1} << 40);
  status = model::MoeBlockDataParallel(c, layout, 0, w, 0, s, pool, huge);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("announces"), std::string::npos) << status.ToString();
}

TEST(DpAttentionTest, UnsupportedCombinationsAreRefusedNamingThem) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  auto file = model::OpenModelFile(ModelPath("stories260K-moe4x2.gguf"));
  ASSERT_TRUE(file.ok());
  auto config = model::ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok());
  const struct {
    parallel::PartitionRequest request;
    const char* names;
  } cases[] = {
      {{.ep = 1, .dp = 2}, "--ep 2"},
      {{.tp = 2, .ep = 2, .dp = 2}, "--tp"},
      {{.pp = 2, .ep = 2, .dp = 2}, "--pp"},
      {{.cp = 2, .ep = 2, .dp = 2}, "--cp"},
  };
  for (const auto& c : cases) {
    auto plan = model::PartitionForModel(*file, *config, c.request);
    ASSERT_FALSE(plan.ok()) << c.names;
    EXPECT_NE(plan.status().message().find(c.names), std::string::npos) << plan.status().ToString();
  }
  if (!HaveModel("stories260K.gguf")) return;
  auto dense = model::OpenModelFile(ModelPath("stories260K.gguf"));
  ASSERT_TRUE(dense.ok());
  auto dense_config = model::ModelConfigFromGguf(*dense);
  ASSERT_TRUE(dense_config.ok());
  auto plan = model::PartitionForModel(*dense, *dense_config, {.ep = 2, .dp = 2});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("mixture-of-experts"), std::string::npos)
      << plan.status().ToString();
}

}  // namespace
}  // namespace tessera::engine
