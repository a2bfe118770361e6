// tessera against an independent numpy forward pass (tests/reference/llama_ref.py,
// run with Debian's /usr/bin/python3): the logits of every position of a 37-token
// sequence agree within 1e-4 relative (to the position's largest |logit|) on the
// f32 models. Skips, saying why, when python3-numpy is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::HaveModel;
using testing::ModelPath;

constexpr const char* kPython = "/usr/bin/python3";

bool HaveNumpy() {
  const std::string cmd = std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Runs the numpy reference; returns [tokens, vocab] logits (empty on failure).
std::vector<float> ReferenceLogits(const std::string& model, const std::vector<int32_t>& tokens,
                                   size_t vocab) {
  const std::string out = ::testing::TempDir() + "/ref_logits_" + std::to_string(getpid()) + ".f32";
  std::string ids;
  for (int32_t t : tokens) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(t);
  }
  const std::string cmd = std::string(kPython) + " " + TESSERA_SOURCE_DIR +
                          "/tests/reference/llama_ref.py " + model + " --tokens " + ids +
                          " --out " + out;
  if (std::system(cmd.c_str()) != 0) return {};
  std::vector<float> logits(tokens.size() * vocab);
  std::ifstream in(out, std::ios::binary);
  in.read(reinterpret_cast<char*>(logits.data()),
          static_cast<std::streamsize>(logits.size() * sizeof(float)));
  const bool complete = in.gcount() == static_cast<std::streamsize>(logits.size() * sizeof(float));
  std::filesystem::remove(out);
  return complete ? logits : std::vector<float>();
}

class NumpyReferenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(NumpyReferenceTest, EveryPositionAgreesWithin1e4Relative) {
  const std::string name = GetParam();
  if (!HaveModel(name)) GTEST_SKIP() << ModelPath(name) << " is not present";
  if (!HaveNumpy()) GTEST_SKIP() << kPython << " cannot import numpy (apt install python3-numpy)";
  auto loaded = LoadModel(ModelPath(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  // The prompt and llama.cpp's greedy continuation (37 tokens).
  std::vector<int32_t> tokens = loaded->tokenizer->Encode("Once upon a time");
  for (int32_t t :
       {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
        410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 390}) {
    tokens.push_back(t);
  }
  const size_t vocab = static_cast<size_t>(loaded->model->config().vocab_size);
  const std::vector<float> want = ReferenceLogits(ModelPath(name), tokens, vocab);
  ASSERT_FALSE(want.empty()) << "the numpy reference failed on " << name;

  // Ours: f32 KV, the sequence in two chunks (20 + 17) so the second attends to cache.
  ThreadPool pool(2);
  testing::TestCache cache(loaded->model->config(), kernels::KvType::kF32, 64);
  testing::LocalRunner local(*loaded->model, cache.cache, pool);
  StepExecutor& runner = local.driver;
  kv::BlockTable table(cache.cache.shape().block_size);
  ASSERT_TRUE(table.Reserve(cache.allocator, static_cast<int64_t>(tokens.size())).ok());
  std::vector<float> ours;
  for (auto [begin, count] : {std::pair<size_t, size_t>{0, 20}, {20, tokens.size() - 20}}) {
    StepEntry entry{.new_tokens = std::span<const int32_t>(tokens).subspan(begin, count),
                    .start_position = static_cast<int64_t>(begin),
                    .block_table = &table};
    auto logits = runner.Step(std::span<const StepEntry>(&entry, 1), /*all_logits=*/true);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    ours.insert(ours.end(), logits->begin(), logits->end());
  }
  table.Release(cache.allocator);
  ASSERT_EQ(ours.size(), want.size());

  double worst_relative = 0;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    double max_abs = 1.0, max_diff = 0;
    for (size_t i = 0; i < vocab; ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(want[pos * vocab + i])));
      max_diff = std::max(
          max_diff, std::abs(static_cast<double>(ours[pos * vocab + i]) - want[pos * vocab + i]));
    }
    const double relative = max_diff / max_abs;
    worst_relative = std::max(worst_relative, relative);
    EXPECT_LE(relative, 1e-4) << name << " position " << pos << ": max |diff| " << max_diff
                              << " vs max |logit| " << max_abs;
  }
  RecordProperty("max_relative_error", std::to_string(worst_relative));
  std::printf("%s: worst relative logit error vs numpy over %zu positions: %.3g\n", name.c_str(),
              tokens.size(), worst_relative);
}

INSTANTIATE_TEST_SUITE_P(F32Models, NumpyReferenceTest,
                         ::testing::Values("stories260K.gguf", "stories260K-ffn192.gguf",
                                           "stories260K-moe4x2.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name = name.substr(0, name.size() - 5);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace tessera::engine
