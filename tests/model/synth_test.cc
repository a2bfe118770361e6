// WriteSynthModel: the written model reads back with the requested shape, passes
// tensor validation, is byte-identical for the same seed, and its weights have
// the promised scale.
#include "model/synth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/quantize.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_util.h"

namespace tessera::model {
namespace {

using kernels::WeightType;

SynthOptions Small() {
  SynthOptions o;
  o.dim = 64;
  o.num_layers = 3;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.ffn_dim = 96;
  o.type = WeightType::kQ8_0;
  o.seed = 11;
  return o;
}

TEST(SynthTest, DenseModelReadsBackAndValidates) {
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0,
                          WeightType::kQ4_0}) {
    SynthOptions o = Small();
    o.type = type;
    std::string path = testing::TempPath("synth_dense.gguf");
    ASSERT_TRUE(WriteSynthModel(o, path).ok());
    Result<GgufFile> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Result<ModelConfig> c = ModelConfigFromGguf(*file);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->dim, 64);
    EXPECT_EQ(c->num_layers, 3);
    EXPECT_EQ(c->num_heads, 8);
    EXPECT_EQ(c->num_kv_heads, 2);
    EXPECT_EQ(c->head_dim, 8);
    EXPECT_EQ(c->ffn_dim, 96);
    EXPECT_EQ(c->vocab_size, 512);
    EXPECT_FALSE(c->tied_output);
    Status valid = ValidateModelTensors(*file, *c);
    EXPECT_TRUE(valid.ok()) << valid.ToString();
    EXPECT_EQ(file->FindTensor("blk.2.ffn_down.weight")->type, type);
    EXPECT_EQ(file->FindTensor("blk.2.ffn_norm.weight")->type, WeightType::kF32);

    // The synthetic vocabulary tokenizes and round-trips text.
    Result<Tokenizer> tok = Tokenizer::FromGguf(*file);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    std::vector<TokenId> ids = tok->Encode("hello, synthetic world 42!");
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(tok->Decode(ids), " hello, synthetic world 42!");
  }
}

// K-quant models: rows of whole 256-element super-blocks, quantised by rounding to
// nearest; the matrices dequantise to the inverse-sqrt-fan-in uniform values
// (within their 4- or 6-bit steps), and rows that are not whole super-blocks are
// refused.
TEST(SynthTest, KQuantModelsReadBackAndValidate) {
  for (WeightType type : {WeightType::kQ4_K, WeightType::kQ6_K}) {
    SCOPED_TRACE(kernels::TraitsOf(type).name);
    SynthOptions o = Small();
    o.dim = 256;
    o.ffn_dim = 512;
    o.type = type;
    const std::string path = testing::TempPath("synth_kquant.gguf");
    Status written = WriteSynthModel(o, path);
    ASSERT_TRUE(written.ok()) << written.ToString();
    Result<GgufFile> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Result<ModelConfig> c = ModelConfigFromGguf(*file);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Status valid = ValidateModelTensors(*file, *c);
    EXPECT_TRUE(valid.ok()) << valid.ToString();
    const GgufTensor* down = file->FindTensor("blk.1.ffn_down.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->type, type);
    std::vector<float> row(512);
    kernels::DequantizeRow(type, down->data.data(), 512, row.data());
    const float half_width = std::sqrt(3.0f / 512);
    double sum_sq = 0;
    for (float v : row) {
      EXPECT_LE(std::fabs(v), half_width * 1.05f);
      sum_sq += v * v;
    }
    EXPECT_NEAR(std::sqrt(sum_sq / 512), 1 / std::sqrt(512.0), 0.25 / std::sqrt(512.0));
    o.ffn_dim = 96 * 2;
    EXPECT_EQ(WriteSynthModel(o, path).code(), StatusCode::kInvalidArgument);
  }
}

TEST(SynthTest, SameSeedSameBytesOtherSeedOtherBytes) {
  SynthOptions o = Small();
  std::string a = testing::TempPath("synth_a.gguf"), b = testing::TempPath("synth_b.gguf");
  ASSERT_TRUE(WriteSynthModel(o, a).ok());
  ASSERT_TRUE(WriteSynthModel(o, b).ok());
  std::vector<uint8_t> bytes_a = testing::ReadBytes(a);
  EXPECT_GT(bytes_a.size(), 100000u);
  EXPECT_EQ(bytes_a, testing::ReadBytes(b));
  o.seed = 12;
  ASSERT_TRUE(WriteSynthModel(o, b).ok());
  EXPECT_NE(bytes_a, testing::ReadBytes(b));
}

// --damp-from L --damp 0: blocks from L write zeros into the residual stream, and
// every tensor the L-block synth of the same seed has is byte-identical (tensors
// are seeded by name), so that one computes exactly what this one does.
TEST(SynthTest, DampedBlocksAddNothingAndTheRestMatchesTheShorterModel) {
  SynthOptions o = Small();
  o.num_layers = 2;
  const std::string short_path = testing::TempPath("synth_short.gguf");
  ASSERT_TRUE(WriteSynthModel(o, short_path).ok());
  o.num_layers = 4;
  o.damp_from = 2;
  o.damp = 0;
  const std::string damped_path = testing::TempPath("synth_damped.gguf");
  ASSERT_TRUE(WriteSynthModel(o, damped_path).ok());
  Result<GgufFile> shorter = GgufFile::Open(short_path);
  Result<GgufFile> damped = GgufFile::Open(damped_path);
  ASSERT_TRUE(shorter.ok() && damped.ok());
  for (const GgufTensor& t : shorter->tensors()) {
    const GgufTensor* same = damped->FindTensor(t.name);
    ASSERT_NE(same, nullptr) << t.name;
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), same->data.begin(), same->data.end()))
        << t.name;
  }
  for (const char* name : {"blk.2.attn_output.weight", "blk.3.ffn_down.weight"}) {
    const GgufTensor* t = damped->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    std::vector<float> v(t->num_elements);
    kernels::DequantizeRow(t->type, t->data.data(), t->num_elements, v.data());
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0; })) << name;
  }
  // The damped blocks' other matrices keep their scale.
  const GgufTensor* q = damped->FindTensor("blk.3.attn_q.weight");
  ASSERT_NE(q, nullptr);
  std::vector<float> v(q->num_elements);
  kernels::DequantizeRow(q->type, q->data.data(), q->num_elements, v.data());
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.05f);
  o.damp_from = 5;
  EXPECT_FALSE(WriteSynthModel(o, damped_path).ok());  // past the last block
}

TEST(SynthTest, WeightsHaveInverseSqrtFanInScale) {
  SynthOptions o = Small();
  o.type = WeightType::kF32;
  std::string path = testing::TempPath("synth_scale.gguf");
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  for (auto [name, fan_in] :
       {std::pair<const char*, int>{"blk.0.attn_q.weight", 64}, {"blk.1.ffn_down.weight", 96}}) {
    const GgufTensor* t = file->FindTensor(name);
    ASSERT_NE(t, nullptr);
    std::vector<float> v(t->num_elements);
    kernels::DequantizeRow(t->type, t->data.data(), t->num_elements, v.data());
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    double mean = sum / v.size(), stddev = std::sqrt(sq / v.size() - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.01) << name;
    EXPECT_NEAR(stddev, 1.0 / std::sqrt(fan_in), 0.1 / std::sqrt(fan_in)) << name;
  }
  const GgufTensor* norm = file->FindTensor("output_norm.weight");
  float first;
  std::memcpy(&first, norm->data.data(), 4);
  EXPECT_EQ(first, 1.0f);
}

TEST(SynthTest, MoeWithCopiedVocabulary) {
  std::string vocab = TESSERA_SHARED_DIR;
  vocab += "/models/stories260K.gguf";
  Result<GgufFile> source = GgufFile::Open(vocab);
  if (!source.ok()) GTEST_SKIP() << source.status().ToString();
  SynthOptions o = Small();
  o.moe = true;
  o.num_experts = 4;
  o.num_experts_used = 2;
  o.type = WeightType::kQ4_0;
  o.vocab_from = vocab;
  std::string path = testing::TempPath("synth_moe.gguf");
  Status s = WriteSynthModel(o, path);
  ASSERT_TRUE(s.ok()) << s.ToString();
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  Result<ModelConfig> c = ModelConfigFromGguf(*file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->is_moe());
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->num_experts_used, 2);
  EXPECT_EQ(c->expert_ffn_dim, 96);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_TRUE(ValidateModelTensors(*file, *c).ok());
  EXPECT_EQ(file->FindTensor("blk.0.ffn_gate_exps.weight")->dims,
            (std::vector<int64_t>{64, 96, 4}));
  EXPECT_EQ(file->FindTensor("blk.0.ffn_gate_inp.weight")->type, WeightType::kF32);
  // The tokenizer is the source's: same ids for the reference prompt.
  Result<Tokenizer> tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->Encode("Once upon a time"), (std::vector<TokenId>{1, 403, 407, 261, 378}));

  o.vocab_size = 1000;  // contradicts the copied vocabulary
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
}

TEST(SynthTest, BadOptionsAreErrors) {
  std::string path = testing::TempPath("synth_bad.gguf");
  SynthOptions o = Small();
  o.num_heads = 6;  // 64 % 6 != 0
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
  o = Small();
  o.num_kv_heads = 3;
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
  o = Small();
  o.ffn_dim = 100;  // not whole q8_0 blocks
  Status s = WriteSynthModel(o, path);
  EXPECT_NE(s.message().find("multiples of 32"), std::string::npos) << s.ToString();
  o = Small();
  o.num_experts = 4;  // without moe
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
  o = Small();
  o.moe = true;
  o.num_experts = 2;
  o.num_experts_used = 3;
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
  o = Small();
  o.vocab_size = 100;
  EXPECT_FALSE(WriteSynthModel(o, path).ok());
}

}  // namespace
}  // namespace tessera::model
