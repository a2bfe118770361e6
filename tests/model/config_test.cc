// ModelConfig from GGUF metadata (llama, MoE, qwen2 with NeoX RoPE, biases, tied
// output, YaRN) and ValidateModelTensors' messages for wrong or missing tensors.
#include "model/config.h"

#include <gtest/gtest.h>

#include "model/gguf_writer.h"
#include "test_util.h"

namespace tessera::model {
namespace {

using kernels::WeightType;

const std::string kModels = std::string(TESSERA_SHARED_DIR) + "/models/";

// Writes a model whose tensors are `tensors` (zero-filled) and metadata is the
// standard keys of `c` under "<arch>.", plus `extra` string keys.
std::string WriteModel(const std::string& name, const ModelConfig& c,
                       const std::vector<ExpectedTensor>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  std::string path = testing::TempPath(name);
  GgufWriter w;
  const std::string a = c.arch + ".";
  w.SetString("general.architecture", c.arch);
  w.SetU32(a + "context_length", static_cast<uint32_t>(c.context_length));
  w.SetU32(a + "embedding_length", static_cast<uint32_t>(c.dim));
  w.SetU32(a + "block_count", static_cast<uint32_t>(c.num_layers));
  w.SetU32(a + "feed_forward_length", static_cast<uint32_t>(c.ffn_dim));
  w.SetU32(a + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  w.SetU32(a + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  w.SetF32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.SetF32(a + "rope.freq_base", 1000000.0f);
  if (c.num_experts) {
    w.SetU32(a + "expert_count", static_cast<uint32_t>(c.num_experts));
    w.SetU32(a + "expert_used_count", static_cast<uint32_t>(c.num_experts_used));
  }
  for (const auto& [key, value] : extra) w.SetString(key, value);
  for (const ExpectedTensor& t : tensors) {
    EXPECT_TRUE(w.AddTensor(t.name, WeightType::kF32, t.dims).ok()) << t.name;
  }
  EXPECT_TRUE(w.Open(path).ok());
  for (size_t i = 0; i < w.num_tensors(); ++i) {
    std::vector<uint8_t> zeros(w.tensor_size_bytes(i));
    EXPECT_TRUE(w.Append(zeros).ok());
  }
  EXPECT_TRUE(w.Close().ok());
  return path;
}

ModelConfig SmallConfig(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 40;
  c.context_length = 128;
  c.dim = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.ffn_dim = 24;
  return c;
}

TEST(ModelConfigTest, Stories260K) {
  Result<GgufFile> file = GgufFile::Open(kModels + "stories260K.gguf");
  if (!file.ok() && file.status().code() == StatusCode::kNotFound) GTEST_SKIP();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> c = ModelConfigFromGguf(*file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->context_length, 2048);
  EXPECT_EQ(c->dim, 64);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->ffn_dim, 172);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_dim, 8);
  EXPECT_EQ(c->rope_layout, RopeLayout::kNormal);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_FALSE(c->is_moe());
  EXPECT_FALSE(c->tied_output);
  EXPECT_FALSE(c->attn_qkv_bias);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_EQ(c->gqa_group(), 2);
  EXPECT_TRUE(ValidateModelTensors(*file, *c).ok());
  EXPECT_EQ(ExpectedTensors(*c).size(), file->tensors().size());
}

TEST(ModelConfigTest, SharedMoeModel) {
  Result<GgufFile> file = GgufFile::Open(kModels + "stories260K-moe4x2.gguf");
  if (!file.ok() && file.status().code() == StatusCode::kNotFound) GTEST_SKIP();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> c = ModelConfigFromGguf(*file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->is_moe());
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->num_experts_used, 2);
  EXPECT_EQ(c->expert_ffn_dim, 172);
  EXPECT_TRUE(ValidateModelTensors(*file, *c).ok());
}

TEST(ModelConfigTest, Qwen2NeoxBiasesTiedOutputAndYarn) {
  ModelConfig want = SmallConfig("qwen2");
  want.attn_qkv_bias = true;
  want.tied_output = true;
  std::string path =
      WriteModel("qwen2.gguf", want, ExpectedTensors(want), {{"qwen2.rope.scaling.type", "yarn"}});
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> c = ModelConfigFromGguf(*file);
  // yarn without a factor is an error naming the key.
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("qwen2.rope.scaling.factor"), std::string::npos);

  GgufWriter w;  // the same with a factor and original context
  path = testing::TempPath("qwen2_yarn.gguf");
  for (const GgufKeyValue& kv : file->metadata()) w.SetValue(kv.key, kv.value);
  w.SetF32("qwen2.rope.scaling.factor", 4.0f);
  w.SetU32("qwen2.rope.scaling.original_context_length", 32);
  for (const GgufTensor& t : file->tensors()) ASSERT_TRUE(w.AddTensor(t.name, t.type, t.dims).ok());
  ASSERT_TRUE(w.Open(path).ok());
  for (const GgufTensor& t : file->tensors()) ASSERT_TRUE(w.Append(t.data).ok());
  ASSERT_TRUE(w.Close().ok());
  file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  c = ModelConfigFromGguf(*file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_layout, RopeLayout::kNeox);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(c->rope_scaling_factor, 4.0f);
  EXPECT_EQ(c->rope_original_context, 32);
  EXPECT_EQ(c->rope_yarn_ext_factor, 1.0f);
  EXPECT_EQ(c->rope_theta, 1000000.0f);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
  EXPECT_TRUE(c->attn_qkv_bias);
  EXPECT_TRUE(c->tied_output);
  EXPECT_EQ(c->vocab_size, 40);
  Status valid = ValidateModelTensors(*file, *c);
  EXPECT_TRUE(valid.ok()) << valid.ToString();
}

TEST(ModelConfigTest, WrongShapeMissingTensorAndWrongNormTypeNameTheTensor) {
  ModelConfig c = SmallConfig("llama");
  std::vector<ExpectedTensor> tensors = ExpectedTensors(c);
  for (ExpectedTensor& t : tensors) {
    if (t.name == "blk.1.attn_k.weight") t.dims = {16, 4};
  }
  Result<GgufFile> file = GgufFile::Open(WriteModel("wrong_shape.gguf", c, tensors));
  ASSERT_TRUE(file.ok());
  Result<ModelConfig> read = ModelConfigFromGguf(*file);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  Status s = ValidateModelTensors(*file, *read);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor blk.1.attn_k.weight has shape [16, 4], expected [16, 8]"),
            std::string::npos)
      << s.message();

  tensors = ExpectedTensors(c);
  std::erase_if(tensors, [](const ExpectedTensor& t) { return t.name == "blk.0.ffn_down.weight"; });
  file = GgufFile::Open(WriteModel("missing.gguf", c, tensors));
  ASSERT_TRUE(file.ok());
  s = ValidateModelTensors(*file, *ModelConfigFromGguf(*file));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor blk.0.ffn_down.weight is missing (expected shape [24, 16])"),
            std::string::npos)
      << s.message();

  // A norm stored as f16.
  std::string path = testing::TempPath("f16_norm.gguf");
  GgufWriter w;
  Result<GgufFile> good = GgufFile::Open(WriteModel("good.gguf", c, ExpectedTensors(c)));
  ASSERT_TRUE(good.ok());
  for (const GgufKeyValue& kv : good->metadata()) w.SetValue(kv.key, kv.value);
  for (const GgufTensor& t : good->tensors()) {
    WeightType type = t.name == "output_norm.weight" ? WeightType::kF16 : t.type;
    ASSERT_TRUE(w.AddTensor(t.name, type, t.dims).ok());
  }
  ASSERT_TRUE(w.Open(path).ok());
  for (size_t i = 0; i < w.num_tensors(); ++i) {
    ASSERT_TRUE(w.Append(std::vector<uint8_t>(w.tensor_size_bytes(i))).ok());
  }
  ASSERT_TRUE(w.Close().ok());
  file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  // Accepted: f16/bf16 norms (Hugging Face checkpoints') are widened when bound.
  s = ValidateModelTensors(*file, *ModelConfigFromGguf(*file));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(ModelConfigTest, InconsistentHyperParametersAreErrors) {
  struct Case {
    std::string key;
    uint32_t value;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"llama.attention.head_count", 5, "embedding_length 16 is not divisible by head_count 5"},
      {"llama.attention.head_count_kv", 3, "head_count 4 is not a multiple of head_count_kv 3"},
      {"llama.block_count", 0, "llama.block_count = 0 is out of range"},
      {"llama.rope.dimension_count", 6, "rope.dimension_count 6 must be even and at most"},
      {"llama.expert_count", 2, "llama.expert_used_count' is missing"},
  };
  ModelConfig c = SmallConfig("llama");
  Result<GgufFile> good = GgufFile::Open(WriteModel("base.gguf", c, ExpectedTensors(c)));
  ASSERT_TRUE(good.ok());
  for (const Case& k : cases) {
    std::string path = testing::TempPath("inconsistent.gguf");
    GgufWriter w;
    for (const GgufKeyValue& kv : good->metadata()) w.SetValue(kv.key, kv.value);
    w.SetU32(k.key, k.value);
    ASSERT_TRUE(w.Open(path).ok());
    ASSERT_TRUE(w.Close().ok());
    Result<GgufFile> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    Result<ModelConfig> read = ModelConfigFromGguf(*file);
    ASSERT_FALSE(read.ok()) << k.key;
    EXPECT_NE(read.status().message().find(k.fragment), std::string::npos)
        << read.status().message();
  }
}

TEST(ModelConfigTest, UnknownArchitectureIsAClearError) {
  ModelConfig c = SmallConfig("gemma");
  Result<GgufFile> file = GgufFile::Open(WriteModel("gemma.gguf", c, ExpectedTensors(c)));
  ASSERT_TRUE(file.ok());
  Result<ModelConfig> read = ModelConfigFromGguf(*file);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("architecture 'gemma' is not supported"),
            std::string::npos);
}

TEST(ModelConfigTest, RopeFreqFactorsAreDetectedAndChecked) {
  ModelConfig c = SmallConfig("llama");
  c.rope_dim = c.head_dim;
  c.rope_freq_factors = true;
  std::vector<ExpectedTensor> tensors = ExpectedTensors(c);
  ASSERT_EQ(tensors[1].name, "rope_freqs.weight");
  EXPECT_EQ(tensors[1].dims, std::vector<int64_t>{2});
  Result<GgufFile> file = GgufFile::Open(WriteModel("rope_freqs.gguf", c, tensors));
  ASSERT_TRUE(file.ok());
  Result<ModelConfig> read = ModelConfigFromGguf(*file);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->rope_freq_factors);
  EXPECT_TRUE(ValidateModelTensors(*file, *read).ok());
  tensors[1].dims = {4};
  file = GgufFile::Open(WriteModel("rope_freqs_bad.gguf", c, tensors));
  ASSERT_TRUE(file.ok());
  Status s = ValidateModelTensors(*file, *ModelConfigFromGguf(*file));
  EXPECT_NE(s.message().find("rope_freqs.weight has shape [4], expected [2]"), std::string::npos)
      << s.ToString();
}

TEST(ModelConfigTest, BlockTensorName) {
  EXPECT_EQ(BlockTensorName(7, "attn_q.weight"), "blk.7.attn_q.weight");
}

}  // namespace
}  // namespace tessera::model
