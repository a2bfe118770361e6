// A Hugging Face checkpoint written from a GGUF runs exactly as that GGUF: the
// same tokens and the same logits, bit for bit, in f32, f16 and bf16 (and bf16
// against the f32 of the same values), from one file and from shards, for a dense
// and a Mixtral-style model, on one rank and split over tp=2 / pp=2 ranks.
#include "model/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/loaded_model.h"
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

Recording RunSingle(const std::string& path) {
  auto loaded = LoadModel(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  Recording run;
  if (!loaded.ok()) return run;
  ThreadPool pool(1);
  testing::TestCache cache(loaded->model->config(), kernels::KvType::kF16, 2048);
  testing::LocalRunner local(*loaded->model, cache.cache, pool);
  Record(testing::GenerateAll(local.driver, *loaded->tokenizer, testing::TestRequests(3, 8)), run);
  return run;
}

Recording RunParallel(const std::string& path, int tp, int pp) {
  Recording run;
  testing::RunThreadedJob(
      path, {.tp = tp, .pp = pp}, [&](StepExecutor& driver, const model::Tokenizer& tokenizer) {
        Record(testing::GenerateAll(driver, tokenizer, testing::TestRequests(3, 8)), run);
      });
  return run;
}

std::string Export(const std::string& gguf, const std::string& name,
                   const model::HfExportOptions& options = {}) {
  const std::string dir =
      ::testing::TempDir() + "/hf_ckpt_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  auto file = model::GgufFile::Open(gguf);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  Status s = model::ExportHfCheckpoint(*file, dir, options);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dir;
}

// Tokenization and the prompt "Once upon a time" agree too.
void ExpectSameTokenizer(const std::string& gguf, const std::string& dir) {
  auto a = LoadModel(gguf);
  auto b = LoadModel(dir);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const char* text : {"Once upon a time, there was a little girl named Lily.",
                           "  two  spaces\nand a newline", "ünïcödé 🦙 <s> 123"}) {
    EXPECT_EQ(a->tokenizer->Encode(text), b->tokenizer->Encode(text)) << text;
  }
}

TEST(HfCheckpointTest, F32MatchesGgufBitForBit) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string gguf = ModelPath("stories260K.gguf");
  const std::string dir = Export(gguf, "f32");
  ExpectSameTokenizer(gguf, dir);
  ExpectSameRecording(RunSingle(gguf), RunSingle(dir), "f32 checkpoint");
  std::filesystem::remove_all(dir);
}

TEST(HfCheckpointTest, F16MatchesGgufBitForBit) {
  if (!HaveModel("stories260K-F16.gguf")) GTEST_SKIP() << "no shared models";
  const std::string gguf = ModelPath("stories260K-F16.gguf");
  const std::string dir = Export(gguf, "f16");
  ExpectSameRecording(RunSingle(gguf), RunSingle(dir), "f16 checkpoint");
  std::filesystem::remove_all(dir);
}

TEST(HfCheckpointTest, Bf16MatchesGgufAndTheF32OfTheSameValues) {
  const std::string gguf =
      ::testing::TempDir() + "/hf_ckpt_bf16_" + std::to_string(::getpid()) + ".gguf";
  model::SynthOptions o{.dim = 128,
                        .num_layers = 3,
                        .num_heads = 8,
                        .num_kv_heads = 2,
                        .ffn_dim = 256,
                        .vocab_size = 512,
                        .type = kernels::WeightType::kBF16,
                        .seed = 11};
  ASSERT_TRUE(model::WriteSynthModel(o, gguf).ok());
  const std::string bf16 = Export(gguf, "bf16", {.dtype = kernels::WeightType::kBF16});
  const std::string f32 = Export(gguf, "bf16_as_f32", {.dtype = kernels::WeightType::kF32});
  const Recording expected = RunSingle(gguf);
  ExpectSameRecording(expected, RunSingle(bf16), "bf16 checkpoint (bf16 norms)");
  ExpectSameRecording(expected, RunSingle(f32), "f32 checkpoint of the bf16 values");
  std::filesystem::remove_all(bf16);
  std::filesystem::remove_all(f32);
  std::filesystem::remove(gguf);
}

TEST(HfCheckpointTest, ShardedMatchesSingleFileAndParallelMatchesOneRank) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "no shared models";
  const std::string gguf = ModelPath("stories260K.gguf");
  const std::string single = Export(gguf, "single");
  const std::string sharded = Export(gguf, "sharded", {.max_shard_bytes = 256 << 10});
  ASSERT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(sharded)) {
    files += e.path().extension() == ".safetensors";
  }
  EXPECT_GE(files, 4);
  const Recording one = RunSingle(gguf);  // the GGUF on one rank
  ExpectSameRecording(one, RunSingle(sharded), "sharded checkpoint");
  ExpectSameRecording(one, RunParallel(sharded, 2, 1), "sharded checkpoint at tp=2");
  ExpectSameRecording(one, RunParallel(single, 1, 2), "checkpoint at pp=2");
  std::filesystem::remove_all(single);
  std::filesystem::remove_all(sharded);
}

TEST(HfCheckpointTest, MixtralStyleMoeMatchesGguf) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  const std::string gguf = ModelPath("stories260K-moe4x2.gguf");
  const std::string dir = Export(gguf, "moe");
  ExpectSameRecording(RunSingle(gguf), RunSingle(dir), "Mixtral-style checkpoint");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::engine
