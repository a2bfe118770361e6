// Tensor, pipeline and context parallelism against the single-rank run: every layout's
// logits must be bit-identical to one rank's (deterministic mode), for dense and
// MoE models, prefill (chunked) and decode, batches of 1..8 sequences, generated
// through the scheduler (pipelines keep several micro-batch steps in flight). Ranks run as
// threads of this process over shared memory, each with its own shard, KV cache,
// one-thread pool and communicators — the same code the CLI's rank processes run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "engine/loaded_model.h"
#include "engine/proposer.h"
#include "engine/stage_runner.h"
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

Recording RunSingle(const std::string& path, int num_sequences, int64_t num_tokens,
                    int64_t step_tokens) {
  auto loaded = LoadModel(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  ThreadPool pool(1);
  testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 2048);
  testing::LocalRunner local(*loaded->model, cache.cache, pool);
  StepExecutor& runner = local.driver;
  Recording run;
  Record(testing::GenerateAll(runner, *loaded->tokenizer,
                              testing::TestRequests(num_sequences, num_tokens), step_tokens),
         run);
  return run;
}

// Runs the plan's ranks as threads; returns the driver's recordings.
Recording RunParallel(const std::string& path, int tp, int pp, int num_sequences,
                      int64_t num_tokens, int64_t step_tokens, bool deterministic = true,
                      int ep = 1, bool sp = false) {
  Recording run;
  const testing::ThreadedJob job{
      .tp = tp, .pp = pp, .ep = ep, .sp = sp, .deterministic = deterministic};
  run.reports = testing::RunThreadedJob(
      path, job, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        Record(testing::GenerateAll(driver, tokenizer,
                                    testing::TestRequests(num_sequences, num_tokens), step_tokens),
               run);
      });
  return run;
}

struct Layout {
  int tp, pp;
  int ep = 1;
  bool sp = false;
  std::string Name() const {
    return "tp" + std::to_string(tp) + " ep" + std::to_string(ep) + (sp ? " sp" : "") + " pp" +
           std::to_string(pp);
  }
};

void CheckLayouts(const std::string& path, const std::vector<Layout>& layouts,
                  const std::vector<int>& batch_sizes, int64_t num_tokens, int64_t chunk) {
  for (int batch : batch_sizes) {
    const Recording single = RunSingle(path, batch, num_tokens, chunk);
    for (const Layout& l : layouts) {
      const Recording parallel = RunParallel(path, l.tp, l.pp, batch, num_tokens, chunk,
                                             /*deterministic=*/true, l.ep, l.sp);
      ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
      ExpectSameRecording(single, parallel, l.Name() + " batch " + std::to_string(batch));
    }
  }
}

TEST(ParallelTest, DenseF32EveryLayoutIsBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  CheckLayouts(ModelPath("stories260K.gguf"),
               {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}, {4, 2}, {2, 3}}, {1, 3}, 6,
               5);
}

TEST(ParallelTest, DenseBatchOfEightWithChunkedPrefill) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  CheckLayouts(ModelPath("stories260K.gguf"), {{2, 1}, {1, 2}, {2, 2}}, {8}, 4, 7);
}

// Steps longer than the blocks' token tile (stories260K: 64 tokens): eight prompts of
// 90 tokens in all prefill in one step, so every block runs two tiles, and under
// tensor parallelism the row-parallel output of both is all-reduced at once.
TEST(ParallelTest, StepsOfSeveralTilesAreBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  auto loaded = LoadModel(ModelPath("stories260K.gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(loaded->model->tile_tokens(), 64);
  CheckLayouts(ModelPath("stories260K.gguf"), {{2, 1}, {1, 2}, {2, 2}}, {8}, 3, 32);
}

// Sequence parallelism: the residual stream split over the tp ranks, reduce-
// scatter + all-gather instead of all-reduce, and the same bits as one rank —
// decode steps (one piece empty under tp 4 with batch 3), chunked prefill mixed in.
TEST(ParallelTest, SequenceParallelIsBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  CheckLayouts(ModelPath("stories260K.gguf"),
               {{2, 1, 1, true}, {4, 1, 1, true}, {2, 2, 1, true}, {4, 2, 1, true}}, {1, 3}, 6, 5);
}

// Steps of several sequence-parallel chunks (256 rows each), the last one uneven:
// four prompts of 130 tokens prefill in one 520-token step (chunks of 256, 256 and
// 8 rows: tp 4 pieces of 64, 64 and 2), then decode together.
TEST(ParallelTest, SequenceParallelStepsOfSeveralChunksAreBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  std::vector<RequestParams> requests = testing::TestRequests(4, 4);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt.clear();
    for (int t = 0; t < 130; ++t) requests[i].prompt.push_back((3 + 29 * t + 71 * i) % 500);
  }
  auto run = [&](const Layout* l) {
    Recording rec;
    auto generate = [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
      Record(testing::GenerateAll(driver, tokenizer, requests, /*step_tokens=*/520), rec);
    };
    if (l == nullptr) {
      auto loaded = LoadModel(path);
      EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
      ThreadPool pool(1);
      testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 2048);
      testing::LocalRunner local(*loaded->model, cache.cache, pool);
      generate(local.driver, *loaded->tokenizer);
    } else {
      const testing::ThreadedJob job{.tp = l->tp, .pp = l->pp, .sp = true};
      rec.reports = testing::RunThreadedJob(path, job, generate);
    }
    return rec;
  };
  const Recording single = run(nullptr);
  for (const Layout& l : {Layout{2, 1, 1, true}, Layout{4, 1, 1, true}, Layout{2, 2, 1, true}}) {
    const Recording parallel = run(&l);
    ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
    ExpectSameRecording(single, parallel, l.Name());
  }
}

TEST(ParallelTest, MoeEveryLayoutIsBitIdentical) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  CheckLayouts(ModelPath("stories260K-moe4x2.gguf"), {{2, 1}, {4, 1}, {1, 2}, {2, 2}, {1, 4}},
               {1, 4}, 5, 6);
}

TEST(ParallelTest, QuantisedSynthModelIsBitIdentical) {
  // Q8_0 and Q4_0 weights (repacked row-parallel slices), GQA, untied head, vocab
  // not a multiple of tp.
  for (kernels::WeightType type : {kernels::WeightType::kQ8_0, kernels::WeightType::kQ4_0}) {
    const std::string path = ::testing::TempDir() + "/parallel_synth_" +
                             std::to_string(static_cast<int>(type)) + ".gguf";
    model::SynthOptions o{.dim = 256,
                          .num_layers = 4,
                          .num_heads = 8,
                          .num_kv_heads = 2,
                          .ffn_dim = 512,
                          .vocab_size = 509,
                          .type = type,
                          .seed = 7};
    ASSERT_TRUE(model::WriteSynthModel(o, path).ok());
    CheckLayouts(path, {{2, 1}, {4, 1}, {2, 2}, {1, 3}}, {2}, 5, 8);
    std::filesystem::remove(path);
  }
}

TEST(ParallelTest, TiedHeadIsBitIdentical) {
  // A head tied to the embedding: on one rank (and on tp ranks, which hold both) the
  // one matrix is interleaved for the matmul and the lookup reads its rows back;
  // across pipeline stages the first reads the GGUF rows and the last its own copy.
  for (kernels::WeightType type : {kernels::WeightType::kQ8_0, kernels::WeightType::kF16}) {
    const std::string path =
        ::testing::TempDir() + "/parallel_tied_" + std::to_string(static_cast<int>(type)) + ".gguf";
    model::SynthOptions o{.dim = 256,
                          .num_layers = 2,
                          .num_heads = 4,
                          .num_kv_heads = 2,
                          .ffn_dim = 512,
                          .vocab_size = 512,
                          .type = type,
                          .seed = 9,
                          .tied_output = true};
    ASSERT_TRUE(model::WriteSynthModel(o, path).ok());
    CheckLayouts(path, {{2, 1}, {1, 2}, {2, 2}}, {2}, 5, 8);
    std::filesystem::remove(path);
  }
}

// Prefix caching under TP and PP: the driver's scheduler attaches cached blocks and
// the workers follow its block ids, so requests served partly from cache (two at
// a time, 16-token chunks) give the logits one rank computes cold.
TEST(ParallelTest, PrefixCacheHitsAreBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  std::vector<RequestParams> requests = testing::TestRequests(6, 5);
  std::vector<int32_t> prefix;
  for (int t = 0; t < 40; ++t) prefix.push_back((7 + 13 * t) % 500);
  for (RequestParams& r : requests) r.prompt.insert(r.prompt.begin(), prefix.begin(), prefix.end());
  const int64_t n = static_cast<int64_t>(requests.size());
  Recording cold;
  {
    auto loaded = LoadModel(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ThreadPool pool(1);
    testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 2048);
    testing::LocalRunner local(*loaded->model, cache.cache, pool);
    Record(testing::GenerateWith(local.driver, *loaded->tokenizer, requests,
                                 {.max_num_batched_tokens = 512,
                                  .max_num_seqs = n,
                                  .max_waiting = n,
                                  .enable_prefix_cache = false}),
           cold);
  }
  for (const Layout& l : std::vector<Layout>{{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    Recording warm;
    SchedulerStats stats;
    testing::RunThreadedJob(
        path, {.tp = l.tp, .pp = l.pp}, [&](StepExecutor& driver, const model::Tokenizer& tok) {
          Record(testing::GenerateWith(
                     driver, tok, requests,
                     {.max_num_batched_tokens = 16, .max_num_seqs = 2, .max_waiting = n}, &stats),
                 warm);
        });
    const std::string what = "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp);
    EXPECT_GT(stats.prefix_cache_hit_blocks_total, 0) << what;
    ExpectSameRecording(cold, warm, what + " with prefix cache hits");
  }
}

// Speculative decoding (n-gram guesses, verified in steps that also carry
// decodes and prefill chunks) under tensor and pipeline parallelism: the tokens
// and logits of the single-rank plain run, bit for bit. The per-entry
// all-logits choice travels to the workers in the step message.
TEST(ParallelTest, SpeculativeDecodingIsBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  // Text the model goes on to repeat (guesses to verify, some right) and text it does not.
  std::vector<RequestParams> requests = testing::TestRequests(5, 24);
  const std::vector<std::string> texts = {
      "Tom had a red ball. He liked the ball. Tom had a red ball. He liked the",
      "The little dog ran to the park. The little dog ran to the park. The little dog ran",
      "Once upon a time", "One day, a big bird sat on a tree. One day, a big bird sat on"};
  for (size_t i = 0; i < texts.size(); ++i)
    requests[i].prompt = loaded->tokenizer->Encode(texts[i]);
  const int64_t n = static_cast<int64_t>(requests.size());
  const SchedulerOptions plain{.max_num_batched_tokens = 24, .max_num_seqs = n, .max_waiting = n};
  Recording single;
  {
    ThreadPool pool(1);
    testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 2048);
    testing::LocalRunner local(*loaded->model, cache.cache, pool);
    Record(testing::GenerateWith(local.driver, *loaded->tokenizer, requests, plain), single);
  }
  SchedulerOptions spec = plain;
  spec.proposer = std::make_shared<NgramProposer>();
  spec.spec_tokens = 4;
  for (const Layout& l : std::vector<Layout>{{1, 1}, {2, 1}, {1, 2}}) {
    Recording run;
    SchedulerStats stats;
    testing::RunThreadedJob(
        path, {.tp = l.tp, .pp = l.pp}, [&](StepExecutor& driver, const model::Tokenizer& tok) {
          Record(testing::GenerateWith(driver, tok, requests, spec, &stats), run);
        });
    const std::string what = "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp);
    EXPECT_GT(stats.spec_accepted_tokens_total, 0) << what;
    EXPECT_GT(stats.spec_proposed_tokens_total, stats.spec_accepted_tokens_total) << what;
    ExpectSameRecording(single, run, what + " speculating");
  }
}

TEST(ParallelTest, FastModeKeepsGreedyTokens) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  const Recording single = RunSingle(path, 2, 8, 16);
  const Recording fast = RunParallel(path, 4, 1, 2, 8, 16, /*deterministic=*/false);
  ASSERT_EQ(single.tokens.size(), fast.tokens.size());
  float max_diff = 0;
  for (size_t i = 0; i < single.tokens.size(); ++i) {
    EXPECT_EQ(single.tokens[i], fast.tokens[i]);
    for (size_t j = 0; j < single.logits[i].size(); ++j) {
      max_diff = std::max(max_diff, std::abs(single.logits[i][j] - fast.logits[i][j]));
    }
  }
  EXPECT_LT(max_diff, 1e-3f);
  std::printf("fast mode (ring / recursive doubling), tp4: max |logit difference| %.3g\n",
              max_diff);
}

TEST(ParallelTest, ReportsCoverEveryRank) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const Recording run = RunParallel(ModelPath("stories260K.gguf"), 2, 2, 2, 3, 16);
  ASSERT_EQ(run.reports.size(), 4u);
  for (size_t r = 0; r < run.reports.size(); ++r) {
    const RankReport& report = run.reports[r];
    EXPECT_EQ(report.rank, static_cast<int>(r));
    EXPECT_EQ(report.stage, static_cast<int>(r) / 2);
    EXPECT_GT(report.weight_bytes, 0);
    EXPECT_GT(report.decode.steps, 0);
  }
}

TEST(ParallelTest, IdleWorkersOutliveTheCommDeadline) {
  // Workers wait for the next step without a deadline (a server between requests);
  // the steps themselves keep theirs.
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const testing::ThreadedJob job{.tp = 2, .pp = 2, .comm_timeout_ms = 300};
  const auto reports = testing::RunThreadedJob(
      ModelPath("stories260K.gguf"), job,
      [](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        for (int round = 0; round < 2; ++round) {
          testing::GenerateAll(driver, tokenizer, testing::TestRequests(2, 3));
          std::this_thread::sleep_for(std::chrono::milliseconds(900));
        }
      });
  EXPECT_EQ(reports.size(), 4u);
}

// Context parallelism (`--cp N`): every sequence's KV spans (256 positions) zig-zag
// over the cp ranks of each stage lane, a step of whole prompts runs split over the
// group by span, any other step every row on every cp rank with the spans'
// partials all-gathered — and the logits are one rank's, bit for bit.

constexpr int64_t kSpan = kernels::kAttentionSpan;

// Greedy requests whose prompts have `lengths` tokens, spread over the vocabulary
// and different for each request, each generating num_tokens (EOS ignored).
std::vector<RequestParams> PromptsOfLengths(const std::vector<int64_t>& lengths,
                                            int64_t num_tokens) {
  std::vector<RequestParams> requests =
      testing::TestRequests(static_cast<int>(lengths.size()), num_tokens);
  for (size_t i = 0; i < lengths.size(); ++i) {
    requests[i].prompt.clear();
    for (int64_t t = 0; t < lengths[i]; ++t) {
      requests[i].prompt.push_back(static_cast<int32_t>((3 + 29 * t + 71 * i) % 500));
    }
  }
  return requests;
}

// The scheduler options of GenerateAll: every request admitted at once, steps of at
// most step_tokens new tokens.
SchedulerOptions StepsOf(const std::vector<RequestParams>& requests, int64_t step_tokens) {
  const int64_t n = static_cast<int64_t>(requests.size());
  return {.max_num_batched_tokens = std::max(step_tokens, n), .max_num_seqs = n, .max_waiting = n};
}

// `requests` on one rank over a KV cache of `kv_tokens`.
Recording RunOneRank(const std::string& path, const std::vector<RequestParams>& requests,
                     const SchedulerOptions& options, int64_t kv_tokens = 2048) {
  Recording run;
  auto loaded = LoadModel(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (!loaded.ok()) return run;
  ThreadPool pool(1);
  testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, kv_tokens);
  testing::LocalRunner local(*loaded->model, cache.cache, pool);
  Record(testing::GenerateWith(local.driver, *loaded->tokenizer, requests, options), run);
  return run;
}

struct CpLayout {
  int tp = 1, pp = 1, cp = 2;
  std::string Name() const {
    return "tp" + std::to_string(tp) + " cp" + std::to_string(cp) + " pp" + std::to_string(pp);
  }
};

// `requests` as `job`'s ranks with the layout's degrees, recording the driver's
// per-step traffic.
Recording RunContextParallel(const std::string& path, const CpLayout& layout,
                             testing::ThreadedJob job, const std::vector<RequestParams>& requests,
                             const SchedulerOptions& options) {
  job.tp = layout.tp;
  job.pp = layout.pp;
  job.cp = layout.cp;
  job.record_traffic = true;
  Recording run;
  run.reports = testing::RunThreadedJob(
      path, job, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        Record(testing::GenerateWith(driver, tokenizer, requests, options), run);
      });
  return run;
}

// Steps the driver ran by path, from its cp group's all-gathers: a step of whole
// prompts (context 0) split over the group — one K/V all-gather a layer and one of
// the head's rows — and every other step unsplit: one all-gather of span partials
// a layer per tile of the step's rows. A step that fits neither fails the test.
struct ContextPaths {
  int split = 0;
  int unsplit = 0;
};

ContextPaths CountContextPaths(const std::string& path, const CpLayout& layout,
                               const Recording& run) {
  ContextPaths paths;
  auto file = model::GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  auto config = model::ModelConfigFromGguf(*file);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto plan =
      model::PartitionForModel(*file, *config, {.tp = layout.tp, .pp = layout.pp, .cp = layout.cp});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!file.ok() || !config.ok() || !plan.ok()) return paths;
  const uint64_t layers = static_cast<uint64_t>(plan->stage_layers.back().size());
  const int driver = plan->driver_rank();
  EXPECT_LT(driver, static_cast<int>(run.reports.size()));
  if (driver >= static_cast<int>(run.reports.size())) return paths;
  const RankReport& report = run.reports[static_cast<size_t>(driver)];
  EXPECT_EQ(report.rank, driver);
  const uint64_t tile = 64;  // stories260K's token tile (StepsOfSeveralTilesAreBitIdentical)
  for (const StepTraffic& step : report.traffic) {
    auto it = step.bytes.find("cp/all_gather");
    const uint64_t calls = it == step.bytes.end() ? 0 : it->second.calls;
    if (step.context == 0) {
      // The K/V rows go round the ring (cp - 1 sends a layer), the head rows are
      // all-gathered once.
      auto ring = step.bytes.find("cp/send");
      const uint64_t sends = ring == step.bytes.end() ? 0 : ring->second.calls;
      EXPECT_EQ(calls, 1u) << layout.Name() << " step " << step.step_id << " of " << step.tokens
                           << " tokens from position 0";
      EXPECT_EQ(sends, layers * static_cast<uint64_t>(layout.cp - 1))
          << layout.Name() << " step " << step.step_id;
      ++paths.split;
    } else {
      const uint64_t tiles = (static_cast<uint64_t>(step.tokens) + tile - 1) / tile;
      EXPECT_EQ(calls, layers * tiles) << layout.Name() << " step " << step.step_id << " of "
                                       << step.tokens << " tokens after " << step.context;
      ++paths.unsplit;
    }
  }
  return paths;
}

// Several prompts of several spans each (up to 4: on cp 2 the zig-zag comes back
// to rank 0) prefill together in one split step; their decodes cross a span
// boundary each (positions 250-256, 509-515, 763-769).
TEST(ParallelTest, ContextParallelLongPromptsAreBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  ASSERT_EQ(kSpan, 256);
  const std::vector<RequestParams> requests = PromptsOfLengths({250, 509, 763}, 8);
  const SchedulerOptions options = StepsOf(requests, 2048);
  const Recording single = RunOneRank(path, requests, options);
  for (const CpLayout& l : {CpLayout{.cp = 2}, CpLayout{.cp = 3}, CpLayout{.tp = 2, .cp = 2},
                            CpLayout{.pp = 2, .cp = 2}}) {
    const Recording parallel = RunContextParallel(path, l, {}, requests, options);
    ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
    EXPECT_EQ(parallel.reports.size(), static_cast<size_t>(l.tp * l.pp * l.cp)) << l.Name();
    ExpectSameRecording(single, parallel, l.Name());
    // The prompts in one split step (pp 2: two micro-batches), 7 decode steps (pp 2: twice).
    const ContextPaths paths = CountContextPaths(path, l, parallel);
    EXPECT_EQ(paths.split, l.pp) << l.Name();
    EXPECT_EQ(paths.unsplit, 7 * l.pp) << l.Name();
  }
}

// Chunked prefill: a prompt's first chunk starts at 0 (split when it is alone in
// its step), its later chunks after it — unsplit, crossing span boundaries, next
// to another sequence's decode or first chunk.
TEST(ParallelTest, ContextParallelChunkedPrefillIsBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  const std::vector<RequestParams> requests = PromptsOfLengths({300, 420}, 6);
  const SchedulerOptions options = StepsOf(requests, 100);
  const Recording single = RunOneRank(path, requests, options);
  for (const CpLayout& l : {CpLayout{.cp = 2}, CpLayout{.cp = 3}, CpLayout{.tp = 2, .cp = 2}}) {
    const Recording parallel = RunContextParallel(path, l, {}, requests, options);
    ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
    ExpectSameRecording(single, parallel, l.Name() + " chunked");
    const ContextPaths paths = CountContextPaths(path, l, parallel);
    EXPECT_GE(paths.split, 1) << l.Name();
    EXPECT_GE(paths.unsplit, 6) << l.Name();  // later chunks and decodes
  }
}

TEST(ParallelTest, ContextParallelMoeIsBitIdentical) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K-moe4x2.gguf");
  const std::vector<RequestParams> requests = PromptsOfLengths({509, 270}, 6);
  for (int64_t step_tokens : {int64_t{2048}, int64_t{200}}) {
    const SchedulerOptions options = StepsOf(requests, step_tokens);
    const Recording single = RunOneRank(path, requests, options);
    for (const CpLayout& l : {CpLayout{.cp = 2}, CpLayout{.tp = 2, .cp = 2}}) {
      const Recording parallel = RunContextParallel(path, l, {}, requests, options);
      ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
      ExpectSameRecording(single, parallel,
                          l.Name() + " MoE, steps of " + std::to_string(step_tokens));
      const ContextPaths paths = CountContextPaths(path, l, parallel);
      EXPECT_GE(paths.split, 1) << l.Name();
    }
  }
}

// Prompts shorter than a span, or than the 2 × cp spans of one zig-zag round:
// some cp ranks hold none of a split step's rows (nor any of its KV) and still take
// part in its all-gathers.
TEST(ParallelTest, ContextParallelShortPromptsAreBitIdentical) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  for (const std::vector<RequestParams>& requests :
       {testing::TestRequests(3, 6), PromptsOfLengths({20}, 5), PromptsOfLengths({300}, 4),
        PromptsOfLengths({600, 7}, 4)}) {
    const std::string what = std::to_string(requests.size()) + " prompts, the first of " +
                             std::to_string(requests[0].prompt.size()) + " tokens";
    const SchedulerOptions options = StepsOf(requests, 2048);
    const Recording single = RunOneRank(path, requests, options);
    for (const CpLayout& l : {CpLayout{.cp = 2}, CpLayout{.cp = 3}}) {
      const Recording parallel = RunContextParallel(path, l, {}, requests, options);
      ASSERT_FALSE(parallel.reports.empty()) << l.Name() << " did not run";
      ExpectSameRecording(single, parallel, l.Name() + ", " + what);
      EXPECT_EQ(CountContextPaths(path, l, parallel).split, 1) << l.Name() << ", " << what;
    }
  }
}

// A prompt one rank's KV pool cannot hold (600 tokens, 400 a rank) served by two:
// rank 0 holds span 0, rank 1 spans 1 and 2 — in one split step, and in the CLI's
// chunks under --cp (the per-rank capacity: 400 tokens, then 200 unsplit).
TEST(ParallelTest, ContextParallelServesAPromptBeyondOneRanksPool) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string path = ModelPath("stories260K.gguf");
  const std::vector<RequestParams> requests = PromptsOfLengths({600}, 8);
  {
    // One rank with that pool refuses it.
    auto loaded = LoadModel(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ThreadPool pool(1);
    testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 400);
    testing::LocalRunner local(*loaded->model, cache.cache, pool);
    Scheduler scheduler(local.driver, *loaded->tokenizer, StepsOf(requests, 1024));
    auto handle = scheduler.Submit(requests[0], {});
    ASSERT_FALSE(handle.ok());
    EXPECT_NE(handle.status().message().find("exceed the model length of 400 tokens"),
              std::string::npos)
        << handle.status().ToString();
  }
  const CpLayout layout{.cp = 2};
  const testing::ThreadedJob job{
      .cp = 2, .kv_capacity_tokens = 400, .max_step_tokens = 1024, .record_traffic = true};
  for (int64_t step_tokens : {int64_t{1024}, int64_t{400}}) {
    const SchedulerOptions options = StepsOf(requests, step_tokens);
    const Recording single = RunOneRank(path, requests, options, /*kv_tokens=*/2048);
    Recording parallel;
    parallel.reports = testing::RunThreadedJob(
        path, job, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
          EXPECT_EQ(driver.kv_partitions(), 2);
          EXPECT_EQ(driver.capacity_tokens(), 800);  // 25 blocks of 16 on each rank
          Record(testing::GenerateWith(driver, tokenizer, requests, options), parallel);
        });
    ASSERT_FALSE(parallel.reports.empty()) << "cp 2 did not run";
    const std::string what = "cp2, 400 KV tokens a rank, steps of " + std::to_string(step_tokens);
    ExpectSameRecording(single, parallel, what);
    const ContextPaths paths = CountContextPaths(path, layout, parallel);
    EXPECT_EQ(paths.split, 1) << what;
    EXPECT_EQ(paths.unsplit, step_tokens == 400 ? 8 : 7) << what;  // (the second chunk,) decodes
  }
}

// A lying (or confused) peer: a step whose block table gives, at an index this cp
// rank holds, a block id of another rank's part of the pool — within the group
// pool's range, so the message itself decodes — is InvalidArgument, never a read or
// write of another sequence's KV.
TEST(ParallelTest, ContextParallelBlockOutsideTheRanksPoolIsRefused) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  auto file = model::OpenModelFile(ModelPath("stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto config = model::ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok());
  auto plan = model::PartitionForModel(*file, *config, {.cp = 2});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->world_size(), 2);
  auto store = std::make_shared<comm::HashStore>();
  comm::CommOptions comm_options;
  comm_options.transport = comm::TransportKind::kShm;
  comm_options.timeout_ms = 10'000;
  comm_options.job_id = "cplie" + std::to_string(::getpid());
  const RuntimeOptions options{.kv_type = kernels::KvType::kF16, .kv_capacity_tokens = 512};
  constexpr int32_t kPerRank = 512 / 16;  // blocks of each rank's cache; the group's ids [0, 64)
  // One token at position 0 whose table (17 blocks: span 0 on rank 0, the start of
  // span 1 on rank 1) is wrong at the index of `liar`.
  auto step = [&](int liar) {
    StepMessage m;
    m.step_id = 0;
    m.tokens = {1};
    parallel::StepSequence seq{.start_position = 0, .num_tokens = 1};
    for (int32_t j = 0; j < 16; ++j) seq.blocks.push_back(j);  // rank 0's ids
    seq.blocks.push_back(kPerRank);                            // rank 1's first
    if (liar == 0) seq.blocks[0] = kPerRank + 3;               // rank 1's id on rank 0
    if (liar == 1) seq.blocks[16] = 3;                         // rank 0's id on rank 1
    m.sequences.push_back(seq);
    return m;
  };
  Status results[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = comm::Communicator::Create(store, r, 2, comm_options);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      auto groups = parallel::MakeGroups(**comm, *plan);
      ASSERT_TRUE(groups.ok()) << groups.status().ToString();
      ThreadPool pool(1);
      auto runner = StageRunner::Create(*plan, r, std::move(*groups), *file, pool, options);
      ASSERT_TRUE(runner.ok()) << runner.status().ToString();
      ASSERT_EQ((*runner)->cache().num_blocks(), kPerRank);
      ASSERT_EQ((*runner)->cp_rank(), r);
      std::vector<float> logits;
      if (r == 0) {
        // The driver: sends rank 1 its lie through the wire, runs its own.
        ASSERT_TRUE((*runner)->is_driver());
        ASSERT_TRUE((*runner)->SendStep(step(1), 1).ok());
        results[0] = (*runner)->RunStep(step(0), &logits);
      } else {
        auto m = (*runner)->ReceiveStep((*runner)->upstream());
        ASSERT_TRUE(m.ok()) << m.status().ToString();  // the ids are in the group's range
        results[1] = (*runner)->RunStep(*m, &logits);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument) << results[0].ToString();
  EXPECT_NE(results[0].message().find("KV block 35 at index 0 is not in cp rank 0's pool [0, 32)"),
            std::string::npos)
      << results[0].ToString();
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1].ToString();
  EXPECT_NE(results[1].message().find("KV block 3 at index 16 is not in cp rank 1's pool [32, 64)"),
            std::string::npos)
      << results[1].ToString();
}

// Prefill/decode disaggregation between instances of different layouts moves KV
// blocks as a whole-model cache lays them out (docs/pd.md): every layout reads a
// prompt's blocks byte for byte as one rank's cache holds them, and a layout that
// writes one rank's blocks into blocks of its own continues from them with the
// logits one rank computes — tp with a KV head per rank, tp with KV heads
// replicated over ranks, pipeline stages, and both.
struct KvMoveRun {
  std::vector<uint8_t> read;        // the prompt's first two blocks, whole
  std::vector<float> continued;     // the logits of a decode step after them
  std::vector<float> after_import;  // the same step over blocks written from `imported`
  Status refused;                   // ReadKvBlocks of a block outside the cache
};

KvMoveRun MoveKvBlocks(StepExecutor& executor, const std::vector<uint8_t>* imported) {
  KvMoveRun run;
  constexpr int32_t kBlock = 16;
  std::vector<int32_t> prompt;
  for (int t = 0; t < 2 * kBlock; ++t) prompt.push_back((5 + 31 * t) % 500);
  const std::vector<int32_t> next = {77};
  kv::BlockAllocator allocator(executor.num_kv_blocks());
  kv::BlockTable computed(kBlock), landed(kBlock);
  EXPECT_TRUE(computed.Reserve(allocator, 2 * kBlock + 1).ok());  // blocks 0, 1, 2
  EXPECT_TRUE(landed.Reserve(allocator, 2 * kBlock + 1).ok());    // blocks 3, 4, 5
  auto step = [&](std::span<const int32_t> tokens, int64_t start, const kv::BlockTable& table) {
    const StepEntry entry{.new_tokens = tokens, .start_position = start, .block_table = &table};
    auto logits = executor.Step(std::span(&entry, 1));
    EXPECT_TRUE(logits.ok()) << logits.status().ToString();
    return logits.ok() ? std::vector<float>(logits->begin(), logits->end()) : std::vector<float>{};
  };
  step(prompt, 0, computed);
  auto shape = executor.whole_kv_shape();
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  const std::vector<int32_t> prompt_blocks(computed.blocks().begin(),
                                           computed.blocks().begin() + 2);
  run.read.resize(2 * static_cast<size_t>(shape->BytesPerBlock()));
  Status read = executor.ReadKvBlocks(prompt_blocks, run.read.data());
  EXPECT_TRUE(read.ok()) << read.ToString();
  run.continued = step(next, 2 * kBlock, computed);
  if (imported != nullptr) {
    const std::vector<int32_t> into(landed.blocks().begin(), landed.blocks().begin() + 2);
    Status written = executor.WriteKvBlocks(into, imported->data());
    EXPECT_TRUE(written.ok()) << written.ToString();
    run.after_import = step(next, 2 * kBlock, landed);
  }
  const std::vector<int32_t> outside = {executor.num_kv_blocks()};
  run.refused = executor.ReadKvBlocks(outside, run.read.data() + run.read.size());
  computed.Release(allocator);
  landed.Release(allocator);
  return run;
}

// The model the KV-moving tests run: 8 query heads over 2 KV heads (tp=4
// replicates each KV head on two ranks), written to `path`.
void WriteGqaModel(const std::string& path) {
  const model::SynthOptions o{.dim = 256,
                              .num_layers = 4,
                              .num_heads = 8,
                              .num_kv_heads = 2,
                              .ffn_dim = 512,
                              .vocab_size = 509,
                              .type = kernels::WeightType::kQ8_0,
                              .seed = 13};
  ASSERT_TRUE(model::WriteSynthModel(o, path).ok());
}

TEST(ParallelTest, KvBlocksMoveWholeBetweenLayouts) {
  const std::string path = ::testing::TempDir() + "/parallel_kv_move.gguf";
  ASSERT_NO_FATAL_FAILURE(WriteGqaModel(path));
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  testing::LocalEngine local(*loaded, 2048);
  const KvMoveRun one = MoveKvBlocks(local.driver, nullptr);
  ASSERT_FALSE(one.read.empty());
  EXPECT_EQ(one.refused.code(), StatusCode::kInvalidArgument);
  for (const Layout& l : std::vector<Layout>{{2, 1}, {4, 1}, {1, 2}, {2, 2}}) {
    KvMoveRun run;
    const auto reports = testing::RunThreadedJob(
        path, {.tp = l.tp, .pp = l.pp}, [&](StepExecutor& driver, const model::Tokenizer&) {
          run = MoveKvBlocks(driver, &one.read);
        });
    ASSERT_FALSE(reports.empty()) << l.Name() << " did not run";
    EXPECT_TRUE(run.read == one.read) << l.Name() << ": the blocks read differ from one rank's";
    ASSERT_EQ(run.continued.size(), one.continued.size()) << l.Name();
    EXPECT_EQ(0, std::memcmp(run.continued.data(), one.continued.data(),
                             one.continued.size() * sizeof(float)))
        << l.Name();
    ASSERT_EQ(run.after_import.size(), one.continued.size()) << l.Name();
    EXPECT_EQ(0, std::memcmp(run.after_import.data(), one.continued.data(),
                             one.continued.size() * sizeof(float)))
        << l.Name() << ": decoding from imported blocks differs";
    EXPECT_EQ(run.refused.code(), StatusCode::kInvalidArgument) << l.Name();
  }
  std::filesystem::remove(path);
}

// What an executor reports of each layer of a 40-token prompt's blocks (KV
// streaming): the layers in order, and each block's piece of each layer.
struct LayerReports {
  std::vector<int32_t> order;
  std::vector<std::vector<uint8_t>> pieces;  // [layer] the blocks' pieces, in turn
  bool supported = false;
};

LayerReports ReportLayers(StepExecutor& executor, kv::BlockAllocator& allocator,
                          const std::function<void(int32_t)>& at_layer = {}) {
  LayerReports out;
  kv::BlockTable table(16);
  EXPECT_TRUE(table.Reserve(allocator, 41).ok());  // 2 full blocks and part of a third
  const std::vector<int32_t> full(table.blocks().begin(), table.blocks().begin() + 2);
  out.supported =
      executor.ObserveKvLayers(full, [&](int32_t layer, std::span<const uint8_t* const> pieces) {
        out.order.push_back(layer);
        auto shape = executor.whole_kv_shape();
        const size_t bytes = static_cast<size_t>(shape->BytesPerBlock() / shape->num_layers);
        std::vector<uint8_t>& bytes_of = out.pieces.emplace_back();
        for (const uint8_t* p : pieces) bytes_of.insert(bytes_of.end(), p, p + bytes);
        if (at_layer) at_layer(layer);
      });
  std::vector<int32_t> prompt;
  for (int t = 0; t < 40; ++t) prompt.push_back((7 + 13 * t) % 500);
  const StepEntry entry{.new_tokens = prompt, .start_position = 0, .block_table = &table};
  EXPECT_TRUE(executor.Step(std::span(&entry, 1)).ok());
  if (out.supported) {
    EXPECT_TRUE(executor.ObserveKvLayers({}, {}));
    // Cleared: a decode step reports nothing.
    const std::vector<int32_t> next = {42};
    const StepEntry decode{.new_tokens = next, .start_position = 40, .block_table = &table};
    const size_t reported = out.order.size();
    EXPECT_TRUE(executor.Step(std::span(&decode, 1)).ok());
    EXPECT_EQ(out.order.size(), reported) << "reported after the observer was cleared";
  }
  table.Release(allocator);
  return out;
}

// KV streaming between instances (docs/pd.md): an executor reports each layer, in
// order, as soon as its K/V is in the cache — on one rank, at layer l's call layer
// l of the blocks holds its final bytes and layer l + 1 nothing yet — as a whole
// model's cache lays it out: over tp ranks (each worker's share received inside
// the step; tp=4 replicates the 2 KV heads) the pieces equal one rank's bit for
// bit, and with sequence parallelism too. A pipeline does not report.
TEST(ParallelTest, EveryLayoutReportsEachLayersKvAsItIsWritten) {
  const std::string path = ::testing::TempDir() + "/parallel_kv_layers.gguf";
  ASSERT_NO_FATAL_FAILURE(WriteGqaModel(path));
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  testing::LocalEngine local(*loaded, 256);
  testing::TestCache& cache = local.cache;
  const kv::KvCacheShape& shape = cache.cache.shape();
  const size_t block_bytes = static_cast<size_t>(shape.BytesPerBlock());
  const size_t layer_bytes = block_bytes / static_cast<size_t>(shape.num_layers);
  auto is_zero = [](const uint8_t* p, size_t n) {
    return std::all_of(p, p + n, [](uint8_t x) { return x == 0; });
  };
  // Blocks 0 and 1 hold the prompt's full blocks: at each call, the next layer of
  // them is still untouched.
  std::vector<bool> next_untouched;
  const LayerReports one = ReportLayers(local.driver, cache.allocator, [&](int32_t layer) {
    bool untouched = true;
    for (int32_t b : {0, 1}) {
      if (layer + 1 < shape.num_layers) {
        untouched = untouched &&
                    is_zero(cache.cache.block_data(b) + (layer + 1) * layer_bytes, layer_bytes);
      }
    }
    next_untouched.push_back(untouched);
  });
  ASSERT_TRUE(one.supported);
  EXPECT_EQ(one.order, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(next_untouched, (std::vector<bool>{true, true, true, true}));
  ASSERT_EQ(one.pieces.size(), 4u);
  for (size_t l = 0; l < 4; ++l) {
    for (int32_t b : {0, 1}) {
      EXPECT_EQ(0, std::memcmp(one.pieces[l].data() + static_cast<size_t>(b) * layer_bytes,
                               cache.cache.block_data(b) + l * layer_bytes, layer_bytes))
          << "layer " << l << " of block " << b << " is not the cache's final bytes";
    }
    EXPECT_FALSE(is_zero(one.pieces[l].data(), 2 * layer_bytes));
  }
  for (const Layout& l :
       std::vector<Layout>{{2, 1}, {4, 1}, {.tp = 2, .pp = 1, .sp = true}, {1, 2}}) {
    LayerReports run;
    const auto reports =
        testing::RunThreadedJob(path, {.tp = l.tp, .pp = l.pp, .sp = l.sp},
                                [&](StepExecutor& driver, const model::Tokenizer&) {
                                  kv::BlockAllocator allocator(driver.num_kv_blocks());
                                  run = ReportLayers(driver, allocator);
                                });
    ASSERT_FALSE(reports.empty()) << l.Name() << " did not run";
    if (l.pp > 1) {
      EXPECT_FALSE(run.supported) << l.Name();
      continue;
    }
    ASSERT_TRUE(run.supported) << l.Name();
    EXPECT_EQ(run.order, one.order) << l.Name();
    EXPECT_TRUE(run.pieces == one.pieces)
        << l.Name() << ": the layers' pieces differ from one rank's";
  }
  std::filesystem::remove(path);
}

TEST(ParallelTest, InvalidPlansAreRefusedBeforeLoading) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  auto file = model::GgufFile::Open(ModelPath("stories260K-ffn192-Q8_0.gguf"));
  ASSERT_TRUE(file.ok());
  auto config = model::ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok());
  auto refused = [&](int tp, int pp, const std::string& layers, const std::string& needle) {
    auto plan = model::PartitionForModel(*file, *config, {.tp = tp, .pp = pp, .pp_layers = layers});
    ASSERT_FALSE(plan.ok()) << "tp" << tp << " pp" << pp;
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().ToString();
  };
  refused(3, 1, "", "tp (3) must divide the 8 query heads");
  refused(4, 1, "", "blk.0.attn_output.weight (q8_0, 64 columns) is reduced in 2 K-chunks");
  refused(1, 6, "", "exceeds the model's 5 layers");
  refused(1, 2, "0-1,3-4", "should start at layer 2");
  refused(1, 2, "0-1,2-3", "the model's last layer is 4");
  refused(1, 2, "0-4", "gives 1 stages, --pp is 2");
  refused(1, 2, "0-x,2-4", "is not a layer range");
  auto refused_sp = [](const model::GgufFile& f, const model::ModelConfig& c,
                       const parallel::PartitionRequest& request, const std::string& needle) {
    auto plan = model::PartitionForModel(f, c, request);
    ASSERT_FALSE(plan.ok()) << needle;
    EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().ToString();
  };
  refused_sp(*file, *config, {.tp = 1, .sp = true}, "it needs --tp 2 or more");
  refused_sp(*file, *config, {.tp = 2, .sp = true, .sp_min_tokens = 0},
             "--sp-min-tokens must be at least 1");
  auto moe = model::GgufFile::Open(ModelPath("stories260K-moe4x2.gguf"));
  ASSERT_TRUE(moe.ok());
  auto moe_config = model::ModelConfigFromGguf(*moe);
  ASSERT_TRUE(moe_config.ok());
  refused_sp(*moe, *moe_config, {.tp = 2, .sp = true}, "--sp runs dense models only");
  refused_sp(*moe, *moe_config, {.tp = 2, .ep = 2, .sp = true}, "--sp is not supported with --ep");
  auto ok = model::PartitionForModel(*file, *config, {.tp = 2, .pp = 2, .pp_layers = "0-0,1-4"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->stage_layers[1].begin, 1);
  EXPECT_EQ(ok->ToString(), "tp2 pp2, stages 0-0 | 1-4");
}

}  // namespace
}  // namespace tessera::engine
