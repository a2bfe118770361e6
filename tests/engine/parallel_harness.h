// Runs a tensor/pipeline/context/expert-parallel job (or data-parallel attention) inside one test
// process: every rank of the plan is a thread with its own communicators (shared memory), shard, KV
// cache and one-thread pool — the code the CLI's rank processes run. The driver thread hands its
// Driver (and the model's tokenizer) to the test. Layer: tests (engine and plan tests use it).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous/hash_store.h"
#include "engine/driver.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "engine/worker.h"
#include "model/hf_checkpoint.h"
#include "model/shard.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "test_models.h"

namespace tessera::engine::testing {

struct ThreadedJob {
  int tp = 1;
  int pp = 1;
  int cp = 1;  // context-parallel ranks per stage lane (each with its part of the KV pool)
  int ep = 1;
  int dp = 1;                                  // data-parallel attention ranks (ep == dp, tp = 1)
  int ep_redundant = 0;                        // replica expert slots per EP rank
  parallel::ExpertPlacement expert_placement;  // empty: every expert at home
  bool sp = false;            // sequence parallelism (steps of at least sp_min_tokens tokens)
  int64_t sp_min_tokens = 1;  // every step (the CLI's default leaves decode on plain tp)
  bool deterministic = true;
  int64_t kv_capacity_tokens = 2048;  // per rank
  int64_t max_step_tokens = 0;        // largest step a rank accepts (0: kv_capacity_tokens)
  bool record_traffic = false;
  int64_t comm_timeout_ms = 60'000;
};

// Greedy requests with prompts of 1..23 tokens spread over the vocabulary, each
// generating exactly num_tokens (EOS ignored).
inline std::vector<RequestParams> TestRequests(int num_sequences, int64_t num_tokens) {
  std::vector<RequestParams> requests;
  for (int i = 0; i < num_sequences; ++i) {
    RequestParams r;
    for (int t = 0; t < 1 + (i * 7 + 3) % 23; ++t) r.prompt.push_back((1 + 37 * t + 101 * i) % 500);
    r.max_tokens = num_tokens;
    r.sampling = model::SamplingParams::Greedy();
    r.ignore_eos = true;
    requests.push_back(r);
  }
  return requests;
}

// The expert-parallel tests' synthetic MoE shapes (tiny, Q8_0): Mixtral-style with
// 8 experts top-2, and qwen2moe with 4 experts top-2 and a shared expert.
inline model::SynthOptions EightExpertSynth() {
  return {.moe = true,
          .dim = 128,
          .num_layers = 2,
          .num_heads = 4,
          .num_kv_heads = 2,
          .ffn_dim = 256,
          .num_experts = 8,
          .num_experts_used = 2,
          .vocab_size = 509,
          .type = kernels::WeightType::kQ8_0,
          .seed = 11};
}
inline model::SynthOptions Qwen2MoeSynth() {
  return {.moe = true,
          .dim = 128,
          .num_layers = 2,
          .num_heads = 4,
          .num_kv_heads = 4,
          .ffn_dim = 64,
          .num_experts = 4,
          .num_experts_used = 2,
          .shared_expert_ffn_dim = 256,
          .vocab_size = 512,
          .type = kernels::WeightType::kQ8_0,
          .seed = 5};
}

// What the driver thread is handed: the pipeline's executor and the model's tokenizer.
using DriveFn = std::function<void(StepExecutor& driver, const model::Tokenizer& tokenizer)>;

// Runs `job` on the model at `path`; `drive` runs on the driver's thread. Returns
// every rank's report (empty if the plan was refused).
inline std::vector<RankReport> RunThreadedJob(const std::string& path, const ThreadedJob& job,
                                              const DriveFn& drive) {
  static std::atomic<int> counter{0};
  auto file = model::OpenModelFile(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return {};
  auto config = model::ModelConfigFromGguf(*file);
  EXPECT_TRUE(config.ok());
  auto tokenizer = model::Tokenizer::FromGguf(*file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  if (!tokenizer.ok()) return {};
  auto plan = model::PartitionForModel(*file, *config,
                                       {.tp = job.tp,
                                        .pp = job.pp,
                                        .cp = job.cp,
                                        .ep = job.ep,
                                        .dp = job.dp,
                                        .sp = job.sp,
                                        .sp_min_tokens = job.sp_min_tokens,
                                        .ep_redundant = job.ep_redundant,
                                        .expert_placement = job.expert_placement});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  const int world = plan->world_size();
  auto store = std::make_shared<comm::HashStore>();
  comm::CommOptions comm_options;
  comm_options.transport = comm::TransportKind::kShm;
  comm_options.timeout_ms = job.comm_timeout_ms;
  comm_options.job_id = "tj" + std::to_string(::getpid()) + "x" + std::to_string(counter++);
  const RuntimeOptions options{.kv_type = kernels::KvType::kF16,
                               .kv_capacity_tokens = job.kv_capacity_tokens,
                               .max_step_tokens = job.max_step_tokens,
                               .deterministic = job.deterministic,
                               .record_traffic = job.record_traffic};
  std::vector<RankReport> reports;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = comm::Communicator::Create(store, r, world, comm_options);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      auto groups = parallel::MakeGroups(**comm, *plan);
      ASSERT_TRUE(groups.ok()) << groups.status().ToString();
      ThreadPool pool(1);
      auto runner = StageRunner::Create(*plan, r, std::move(*groups), *file, pool, options);
      ASSERT_TRUE(runner.ok()) << runner.status().ToString();
      if (!(*runner)->is_driver()) {
        Status s = ServeWorker(**runner);
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
        return;
      }
      Driver driver(**runner);
      drive(driver, *tokenizer);
      auto all = driver.Shutdown();
      ASSERT_TRUE(all.ok()) << all.status().ToString();
      reports = std::move(*all);
    });
  }
  for (std::thread& t : threads) t.join();
  return reports;
}

// What a generation test compares across layouts: every sequence's tokens and
// logits, in request order (and the ranks' reports, where a test keeps them).
struct Recording {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<RankReport> reports;
};

// Appends `generated` to `run`, failing the test on a sequence that ended in error.
inline void Record(const std::vector<Generation>& generated, Recording& run) {
  for (const Generation& g : generated) {
    EXPECT_TRUE(g.result.error.ok()) << g.result.error.ToString();
    run.tokens.push_back(g.tokens);
    run.logits.push_back(g.logits);
  }
}

// `actual` has `expected`'s tokens and logits, bit for bit (`what` names the run).
inline void ExpectSameRecording(const Recording& expected, const Recording& actual,
                                const std::string& what) {
  ASSERT_EQ(expected.logits.size(), actual.logits.size()) << what;
  ASSERT_FALSE(expected.logits.empty()) << what;
  for (size_t i = 0; i < expected.logits.size(); ++i) {
    EXPECT_EQ(expected.tokens[i], actual.tokens[i]) << what << " sequence " << i;
    ASSERT_EQ(expected.logits[i].size(), actual.logits[i].size()) << what << " sequence " << i;
    EXPECT_EQ(0, std::memcmp(expected.logits[i].data(), actual.logits[i].data(),
                             expected.logits[i].size() * sizeof(float)))
        << what << " sequence " << i << ": logits differ";
  }
}

}  // namespace tessera::engine::testing
