#include "plan/model_shape.h"

#include <gtest/gtest.h>

#include "plan/dtype.h"
#include "plan/presets.h"
#include "plan/traffic.h"

namespace tessera::plan {
namespace {

TEST(ModelShapeTest, Llama3ParameterCountsMatchThePublishedSizes) {
  const ModelShape m8 = *ModelPreset("llama-3-8b");
  // 32·(2·4096² + 2·4096·1024 + 3·4096·14336 + 2·4096) + 2·128256·4096 + 4096
  EXPECT_EQ(CountParams(m8).Total(m8), 8030261248);
  const ModelShape m70 = *ModelPreset("Llama-3-70B");  // case-insensitive
  EXPECT_EQ(CountParams(m70).Total(m70), 70553706496);
}

TEST(ModelShapeTest, MixtralTotalAndActive) {
  const ModelShape m = *ModelPreset("mixtral-8x7b");
  const ParamCounts p = CountParams(m);
  // 46.7 B total (Mistral's figure); 12.9 B active in Mistral's count includes the
  // 131 M embedding table, a lookup the planner does not count as touched.
  EXPECT_NEAR(p.Total(m) / 1e9, 46.7, 0.05);
  EXPECT_NEAR((p.ActivePerToken(m) + p.embedding) / 1e9, 12.9, 0.05);
}

TEST(ModelShapeTest, SeedsKvExampleIsTwoGiB) {
  // LLaMA-7B: 32 layers, hidden 4096 (32 heads × 128, no GQA), 4096 tokens, fp16:
  // 4096 × 32 × 2 × 32 × 128 × 2 B = 2^31 B = 2 GiB.
  const ModelShape m = *ModelPreset("llama-2-7b");
  const DType f16 = *ParseDType("f16");
  EXPECT_EQ(KvTransferBytes(m, f16, 4096), int64_t{1} << 31);
  // Under GQA the cache shrinks with kv_heads: Llama-3-8B (8 KV heads) holds 512 MiB.
  EXPECT_EQ(KvTransferBytes(*ModelPreset("llama-3-8b"), f16, 4096), int64_t{512} << 20);
  // MLA caches the latent: DeepSeek-V3-like, 576 elements per token per layer.
  const ModelShape ds = *ModelPreset("deepseek-v3-like");
  EXPECT_EQ(KvTransferBytes(ds, f16, 1000), 1000 * 61 * 576 * 2);
}

TEST(ModelShapeTest, EveryPresetValidates) {
  for (const std::string& name : ModelPresetNames()) {
    Result<ModelShape> m = ModelPreset(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    EXPECT_TRUE(ValidateModelShape(*m).ok()) << name;
    EXPECT_TRUE(ParseDType(m->weight_dtype).ok()) << name;
  }
}

TEST(ModelShapeTest, UnknownPresetNamesTheKnownOnes) {
  Result<ModelShape> m = ModelPreset("llama-9-1t");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("llama-9-1t"), std::string::npos);
  EXPECT_NE(m.status().message().find("llama-3-70b"), std::string::npos);
}

TEST(ModelShapeTest, BadShapesNameTheConstraint) {
  ModelShape m = *ModelPreset("llama-3-8b");
  m.num_kv_heads = 5;
  Status s = ValidateModelShape(m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of kv_heads"), std::string::npos) << s.message();
  m = *ModelPreset("llama-3-8b");
  m.dim = -1;
  EXPECT_NE(ValidateModelShape(m).message().find("hidden must be positive"), std::string::npos);
  m = *ModelPreset("mixtral-8x7b");
  m.num_experts_used = 9;
  EXPECT_NE(ValidateModelShape(m).message().find("exceeds experts"), std::string::npos);
}

TEST(ModelShapeTest, ParsesAUserShape) {
  Result<ModelShape> m = ParseModelShapeJson(
      R"({"name": "mine", "layers": 4, "hidden": 256, "heads": 4, "ffn": 512, "vocab": 1000})",
      "mine.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_FALSE(ParseModelShapeJson(R"({"layers": 4})", "bad.json").ok());
  EXPECT_FALSE(ParseModelShapeJson("not json", "bad.json").ok());
}

TEST(DTypeTest, QuantBlocksCountTheirOverhead) {
  const DType q8 = *ParseDType("q8_0");
  EXPECT_EQ(q8.BytesOf(64), 68);
  EXPECT_EQ(q8.BytesOf(33), 68);  // a partial block costs a block
  EXPECT_DOUBLE_EQ(q8.bytes_per_elem(), 34.0 / 32);
  EXPECT_EQ(ParseDType("q4_k")->BytesOf(256), 144);
  EXPECT_EQ(ParseDType("q4_K")->name, "q4_k");  // llama.cpp's spelling
  EXPECT_EQ(ParseDType("bf16")->BytesOf(10), 20);
  Result<DType> bad = ParseDType("int3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q8_0"), std::string::npos);
}

}  // namespace
}  // namespace tessera::plan
