// Golden tests against llama.cpp's references in shared/models/refs: greedy
// generation of 32 tokens after "Once upon a time" must match token for token on
// every stories260K model; llama-2-tiny-random (random weights, near-tied logits)
// must match the top-5 logits within 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::HaveModel;
using testing::ModelPath;
using testing::ModelsDir;

struct Reference {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::string generated_text;
  // steps[i]: the reference's top-5 (id, logit) at generated position i.
  std::vector<std::vector<std::pair<int32_t, float>>> steps;
};

Reference ReadReference(const std::string& model) {
  const std::string path = ModelsDir() + "/refs/" + model.substr(0, model.size() - 5) + ".json";
  std::ifstream in(path);
  TESSERA_CHECK(in) << "cannot open " << path;
  nlohmann::json json = nlohmann::json::parse(in);
  const nlohmann::json& p = json["prompts"][0];
  TESSERA_CHECK(p["prompt"] == "Once upon a time");
  Reference ref;
  ref.prompt_ids = p["prompt_ids"].get<std::vector<int32_t>>();
  ref.generated_ids = p["generated_ids"].get<std::vector<int32_t>>();
  ref.generated_text = p["generated_text"].get<std::string>();
  for (const nlohmann::json& step : p["steps"]) {
    auto& top = ref.steps.emplace_back();
    for (const nlohmann::json& t : step["top"]) {
      top.emplace_back(t["id"].get<int32_t>(), t["logit"].get<float>());
    }
  }
  return ref;
}

struct Generated {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // per generated position
};

Generated GenerateGreedy(const LoadedModel& loaded, const std::vector<int32_t>& prompt, int64_t n,
                         kernels::KvType kv_type, int threads) {
  ThreadPool pool(threads);
  testing::TestCache cache(loaded.model->config(), kv_type, 64);
  testing::LocalRunner local(*loaded.model, cache.cache, pool);
  StepExecutor& runner = local.driver;
  RequestParams request{.prompt = prompt,
                        .max_tokens = n,
                        .sampling = model::SamplingParams::Greedy(),
                        .ignore_eos = true};
  const std::vector<testing::Generation> generated =
      testing::GenerateAll(runner, *loaded.tokenizer, {request});
  Generated out;
  out.ids = generated[0].tokens;
  const size_t vocab = static_cast<size_t>(runner.vocab_size());
  for (size_t i = 0; i < out.ids.size(); ++i) {
    const auto row = generated[0].logits.begin() + static_cast<ptrdiff_t>(i * vocab);
    out.logits.emplace_back(row, row + static_cast<ptrdiff_t>(vocab));
  }
  return out;
}

// Largest |ours - reference| over the reference's top-5 ids at generated position `step`.
float TopFiveError(const Reference& ref, const Generated& ours, size_t step) {
  float worst = 0;
  for (const auto& [id, logit] : ref.steps[step]) {
    worst = std::max(worst, std::abs(ours.logits[step][static_cast<size_t>(id)] - logit));
  }
  return worst;
}

struct GoldenCase {
  const char* model;
  // Largest |ours - llama.cpp| allowed on the reference's top-5 logits. F32/F16
  // weights: a few 1e-3 (summation order, f16 KV). Q8_0/Q4_0: both engines quantise
  // activations to 8 bits, and llama.cpp's own logits are up to 0.23 from exact
  // (f64, dequantised-weight) arithmetic on these models; ours are as close.
  float top5_tolerance;
  // Quantised models only: greedy may leave llama.cpp's path at a step where its
  // top-1 beat our pick by less than this (a rounding tie: on the Q4_0 model with
  // f16 KV, exact arithmetic picks our token at the one such step). 0: must match.
  float tie_tolerance;
};

class StoriesGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(StoriesGoldenTest, GreedyMatchesLlamaCppTokenForToken) {
  const GoldenCase& param = GetParam();
  const std::string name = param.model;
  if (!HaveModel(name)) GTEST_SKIP() << ModelPath(name) << " is not present";
  auto loaded = LoadModel(ModelPath(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Reference ref = ReadReference(name);
  ASSERT_EQ(loaded->tokenizer->Encode("Once upon a time"), ref.prompt_ids);
  for (kernels::KvType kv_type : {kernels::KvType::kF16, kernels::KvType::kF32}) {
    const std::string kv_name = kv_type == kernels::KvType::kF16 ? "f16" : "f32";
    std::vector<int32_t> first_ids;
    for (int threads : {1, 2}) {
      SCOPED_TRACE(name + ", kv " + kv_name + ", threads " + std::to_string(threads));
      const Generated ours = GenerateGreedy(*loaded, ref.prompt_ids, 32, kv_type, threads);
      ASSERT_EQ(ours.ids.size(), ref.generated_ids.size());
      // Thread count never changes a bit.
      if (threads == 1) first_ids = ours.ids;
      EXPECT_EQ(ours.ids, first_ids);
      size_t matched = 0;
      while (matched < ours.ids.size() && ours.ids[matched] == ref.generated_ids[matched]) {
        ++matched;
      }
      float worst = 0;
      for (size_t step = 0; step < std::min(matched + 1, ours.ids.size()); ++step) {
        worst = std::max(worst, TopFiveError(ref, ours, step));
      }
      EXPECT_LE(worst, param.top5_tolerance) << "top-5 logits differ from llama.cpp's";
      RecordProperty("max_top5_logit_error_kv_" + kv_name, std::to_string(worst));
      if (matched == ours.ids.size()) {
        EXPECT_EQ(loaded->tokenizer->Decode(ours.ids), ref.generated_text);
        continue;
      }
      // A divergence is only acceptable as a rounding tie on a quantised model.
      const auto& top = ref.steps[matched];
      auto it = std::find_if(top.begin(), top.end(),
                             [&](const auto& entry) { return entry.first == ours.ids[matched]; });
      ASSERT_NE(it, top.end()) << "step " << matched << ": our token " << ours.ids[matched]
                               << " is not in llama.cpp's top 5";
      const float gap = top[0].second - it->second;
      EXPECT_LT(gap, param.tie_tolerance)
          << "step " << matched << ": llama.cpp picked " << ref.generated_ids[matched]
          << ", we picked " << ours.ids[matched] << ", its logit gap is " << gap;
      std::printf("%s kv %s: tie at step %zu (llama.cpp gap %.4f), %zu/32 tokens identical\n",
                  name.c_str(), kv_name.c_str(), matched, gap, matched);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StoriesGoldenTest,
                         ::testing::Values(GoldenCase{"stories260K.gguf", 0.02f, 0.0f},
                                           GoldenCase{"stories260K-F16.gguf", 0.02f, 0.0f},
                                           GoldenCase{"stories260K-ffn192.gguf", 0.02f, 0.0f},
                                           GoldenCase{"stories260K-moe4x2.gguf", 0.02f, 0.0f},
                                           GoldenCase{"stories260K-ffn192-Q8_0.gguf", 0.5f, 0.1f},
                                           GoldenCase{"stories260K-ffn192-Q4_0.gguf", 0.5f, 0.1f}),
                         [](const auto& info) {
                           std::string name = info.param.model;
                           name = name.substr(0, name.size() - 5);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(StoriesGoldenTest, ContinuesWithThePublishedLlama2cSample) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  auto loaded = LoadModel(ModelPath("stories260K.gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Generated ours = GenerateGreedy(*loaded, loaded->tokenizer->Encode("Once upon a time"), 32,
                                        kernels::KvType::kF16, 1);
  EXPECT_EQ(loaded->tokenizer->Decode(ours.ids),
            ", there was a little girl named Lily. She loved to play outside in the park. One "
            "day, she saw");
}

TEST(TinyRandomGoldenTest, TopFiveLogitsWithin1e3OfLlamaCpp) {
  const std::string name = "llama-2-tiny-random.gguf";
  if (!HaveModel(name)) GTEST_SKIP() << ModelPath(name) << " is not present";
  auto loaded = LoadModel(ModelPath(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Reference ref = ReadReference(name);
  ASSERT_EQ(loaded->tokenizer->Encode("Once upon a time"), ref.prompt_ids);
  // Teacher-forced: feed the reference's tokens so every step sees the same context.
  ThreadPool pool(2);
  testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 64);
  testing::LocalRunner local(*loaded->model, cache.cache, pool);
  StepExecutor& runner = local.driver;
  kv::BlockTable table(cache.cache.shape().block_size);
  std::vector<int32_t> tokens = ref.prompt_ids;
  tokens.insert(tokens.end(), ref.generated_ids.begin(), ref.generated_ids.end());
  ASSERT_TRUE(table.Reserve(cache.allocator, static_cast<int64_t>(tokens.size())).ok());
  StepEntry entry{.new_tokens = tokens, .start_position = 0, .block_table = &table};
  auto logits = runner.Step(std::span<const StepEntry>(&entry, 1), /*all_logits=*/true);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  const size_t vocab = static_cast<size_t>(runner.vocab_size());
  float worst = 0;
  for (size_t step = 0; step < ref.steps.size(); ++step) {
    const size_t row = ref.prompt_ids.size() - 1 + step;
    for (const auto& [id, logit] : ref.steps[step]) {
      const float ours = (*logits)[row * vocab + static_cast<size_t>(id)];
      EXPECT_NEAR(ours, logit, 1e-3f) << "step " << step << " token " << id;
      worst = std::max(worst, std::abs(ours - logit));
    }
  }
  RecordProperty("max_top5_logit_error", std::to_string(worst));
  table.Release(cache.allocator);
}

}  // namespace
}  // namespace tessera::engine
