// Helpers for the engine tests: where the shared test models are, a KV cache of a
// given size, and generating through the scheduler as `tessera generate` does.
// Layer: tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "engine/driver.h"
#include "engine/loaded_model.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "kv/block_allocator.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"

namespace tessera::engine::testing {

inline std::string ModelsDir() { return std::string(TESSERA_SHARED_DIR) + "/models"; }
inline std::string ModelPath(const std::string& name) { return ModelsDir() + "/" + name; }

inline bool HaveModel(const std::string& name) { return std::filesystem::exists(ModelPath(name)); }

// A KV cache + allocator sized for `num_tokens` tokens in total.
struct TestCache {
  TestCache(const model::ModelConfig& c, kernels::KvType type, int64_t num_tokens,
            int32_t block_size = 16)
      : cache(std::move(kv::KvCache::Create(
                            {.num_layers = static_cast<int32_t>(c.num_layers),
                             .num_kv_heads = static_cast<int32_t>(c.num_kv_heads),
                             .head_dim = static_cast<int32_t>(c.head_dim),
                             .block_size = block_size,
                             .type = type},
                            static_cast<int32_t>(kv::BlocksForTokens(num_tokens, block_size))))
                  .value()),
        allocator(cache.num_blocks()) {}
  kv::KvCache cache;
  kv::BlockAllocator allocator;
};

// One rank's runner over a whole loaded model and a test cache, and the Driver
// that is its StepExecutor: the path `tessera generate` and `serve` take on one rank.
struct LocalRunner {
  LocalRunner(const model::LlamaModel& model, kv::KvCache& cache, ThreadPool& pool)
      : runner(std::move(StageRunner::CreateLocal(model, cache, pool)).value()), driver(*runner) {}
  std::unique_ptr<StageRunner> runner;
  Driver driver;
};

// A single-rank engine over its own f16 KV cache of `kv_tokens` tokens, one
// compute thread: `driver` is the StepExecutor a Scheduler runs on.
struct LocalEngine {
  LocalEngine(const LoadedModel& loaded, int64_t kv_tokens)
      : cache(loaded.model->config(), kernels::KvType::kF16, kv_tokens),
        local(*loaded.model, cache.cache, pool) {}
  ThreadPool pool{1};
  TestCache cache;
  LocalRunner local;
  Driver& driver = local.driver;
};

// A suite over ../shared/models/stories260K.gguf, loaded once for the suite (its
// tests are skipped without it).
class SharedModelTest : public ::testing::Test {
 protected:
  static constexpr const char* kModel = "stories260K.gguf";
  static void SetUpTestSuite() {
    if (!HaveModel(kModel)) return;
    auto loaded = LoadModel(ModelPath(kModel));
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    loaded_ = new LoadedModel(std::move(loaded).value());
  }
  static void TearDownTestSuite() {
    delete loaded_;
    loaded_ = nullptr;
  }
  void SetUp() override {
    if (loaded_ == nullptr) GTEST_SKIP() << ModelPath(kModel) << " is not present";
  }
  const model::Tokenizer& tokenizer() const { return *loaded_->tokenizer; }
  std::vector<int32_t> Encode(const std::string& text) const { return tokenizer().Encode(text); }
  // The reference the cache and layout tests compare with: every request computed
  // cold on one plain rank, the prefix cache off, all in one batch and one chunk.
  std::vector<struct Generation> Cold(const std::vector<RequestParams>& ps) const;

  static inline LoadedModel* loaded_ = nullptr;
};

// What one request produced: its tokens and the logits row each was sampled from.
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, vocab]
  RequestResult result;
};

// `n` token ids spread over the vocabulary, different for each `seed`.
inline std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> out;
  for (int t = 0; t < n; ++t) out.push_back((1 + 37 * t + 101 * seed) % 500);
  return out;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A greedy request for `prompt` generating exactly `max_tokens` (EOS ignored).
inline RequestParams Greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling = model::SamplingParams::Greedy();
  p.ignore_eos = true;
  return p;
}

// `got` ended without error with `want`'s tokens and logits, bit for bit.
inline void ExpectSameGenerations(const std::vector<Generation>& want,
                                  const std::vector<Generation>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_TRUE(got[i].result.error.ok()) << got[i].result.error.ToString();
    EXPECT_EQ(want[i].tokens, got[i].tokens);
    ASSERT_EQ(want[i].logits.size(), got[i].logits.size());
    EXPECT_EQ(0, std::memcmp(want[i].logits.data(), got[i].logits.data(),
                             want[i].logits.size() * sizeof(float)))
        << "logits differ";
  }
}

// Runs `requests` to completion on this thread through a Scheduler over `executor`
// — the loop `tessera generate` runs: every request submitted up front, steps of at
// most max(step_tokens, requests) new tokens.
inline std::vector<Generation> GenerateWith(StepExecutor& executor,
                                            const model::Tokenizer& tokenizer,
                                            const std::vector<RequestParams>& requests,
                                            const SchedulerOptions& options,
                                            SchedulerStats* stats = nullptr);

inline std::vector<Generation> GenerateAll(StepExecutor& executor,
                                           const model::Tokenizer& tokenizer,
                                           const std::vector<RequestParams>& requests,
                                           int64_t step_tokens = 512) {
  const int64_t n = static_cast<int64_t>(requests.size());
  return GenerateWith(executor, tokenizer, requests,
                      {.max_num_batched_tokens = std::max(step_tokens, n),
                       .max_num_seqs = n,
                       .max_waiting = n,
                       .prefix_wait_min_tokens = 0});  // as generate: the requests are one batch
}

// GenerateAll under the given scheduler options; `stats`, when given, receives the
// scheduler's stats at the end.
inline std::vector<Generation> GenerateWith(StepExecutor& executor,
                                            const model::Tokenizer& tokenizer,
                                            const std::vector<RequestParams>& requests,
                                            const SchedulerOptions& options,
                                            SchedulerStats* stats) {
  Scheduler scheduler(executor, tokenizer, options);
  std::vector<Generation> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Generation& g = out[i];
    auto handle = scheduler.Submit(
        requests[i], {.on_token =
                          [&g](const TokenEvent& e) {
                            g.tokens.push_back(e.token);
                            g.logits.insert(g.logits.end(), e.logits.begin(), e.logits.end());
                          },
                      .on_done = [&g](const RequestResult& r) { g.result = r; }});
    EXPECT_TRUE(handle.ok()) << handle.status().ToString();
  }
  scheduler.Stop(/*cancel_in_flight=*/false);
  const Status status = scheduler.Run();
  EXPECT_TRUE(status.ok()) << status.ToString();
  if (stats != nullptr) *stats = scheduler.Stats();
  return out;
}

inline std::vector<Generation> SharedModelTest::Cold(const std::vector<RequestParams>& ps) const {
  LocalEngine engine(*loaded_, 4096);
  const int64_t n = static_cast<int64_t>(ps.size());
  return GenerateWith(engine.driver, tokenizer(), ps,
                      {.max_num_batched_tokens = 2048,
                       .max_num_seqs = n,
                       .max_waiting = n,
                       .enable_prefix_cache = false});
}

}  // namespace tessera::engine::testing
