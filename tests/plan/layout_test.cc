#include "plan/layout.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

Status Check(const char* model, const char* dtype, Parallelism p) {
  return ValidateParallelism(*ModelPreset(model), *ParseDType(dtype), p);
}

std::string Message(const Status& s) { return s.message(); }

TEST(LayoutTest, TensorParallelMustDivideTheHeads) {
  EXPECT_TRUE(Check("llama-3-8b", "bf16", {.tp = 8}).ok());
  Status s = Check("llama-3-8b", "bf16", {.tp = 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Message(s).find("tp (3) must divide the query heads (32)"), std::string::npos)
      << Message(s);
  // tp above the KV heads replicates them (8 KV heads, tp 16 → 2 copies each)...
  EXPECT_TRUE(Check("llama-3-8b", "bf16", {.tp = 16}).ok());
  // ...but tp and the KV heads must divide one another: stories260K has 4 KV heads.
  EXPECT_TRUE(Check("stories260k", "f32", {.tp = 4}).ok());
  EXPECT_NE(Message(Check("stories260k", "f32", {.tp = 8})).find("tp (8) must divide ffn (172)"),
            std::string::npos);
  ModelShape odd = *ModelPreset("stories260k");
  odd.num_heads = 12;
  odd.num_kv_heads = 6;
  odd.head_dim = 16;
  s = ValidateParallelism(odd, *ParseDType("f32"), {.tp = 4});
  EXPECT_NE(Message(s).find("KV heads (6) must divide one another"), std::string::npos)
      << Message(s);
}

TEST(LayoutTest, QuantisedRowSplitsMustKeepWholeBlocks) {
  // stories260K's FFN is 172 wide: not a whole number of 32-element q8_0 blocks
  // even unsplit, and tp=2 gives 86.
  Status s = Check("stories260k", "q8_0", {.tp = 2});
  EXPECT_NE(Message(s).find("whole number of q8_0 blocks"), std::string::npos) << Message(s);
  // TinyLlama's 5632 / 2 = 2816 = 88 blocks of 32: fine; / 8 = 704 = 22 blocks; but
  // q4_k blocks are 256 elements: 5632 / 2 = 2816 = 11 blocks, / 4 = 1408 is not.
  EXPECT_TRUE(Check("tinyllama-1.1b", "q8_0", {.tp = 8}).ok());
  EXPECT_TRUE(Check("tinyllama-1.1b", "q4_k", {.tp = 2}).ok());
  s = Check("tinyllama-1.1b", "q4_k", {.tp = 4});
  EXPECT_NE(Message(s).find("ffn / tp = 1408"), std::string::npos) << Message(s);
}

TEST(LayoutTest, PipelineAndExpertRules) {
  Status s = Check("stories260k", "f32", {.pp = 6});
  EXPECT_NE(Message(s).find("pp (6) exceeds the layers (5)"), std::string::npos) << Message(s);
  s = Check("llama-3-8b", "bf16", {.tp = 2, .ep = 2});
  EXPECT_NE(Message(s).find("needs an MoE model"), std::string::npos) << Message(s);
  s = Check("mixtral-8x7b", "bf16", {.tp = 2, .dp = 3, .ep = 3});
  EXPECT_NE(Message(s).find("ep (3) must divide the experts (8)"), std::string::npos) << Message(s);
  s = Check("mixtral-8x7b", "bf16", {.tp = 2, .ep = 4});
  EXPECT_NE(Message(s).find("must divide tp*dp (2)"), std::string::npos) << Message(s);
  EXPECT_TRUE(Check("mixtral-8x7b", "bf16", {.tp = 2, .dp = 2, .ep = 4}).ok());
  // With ep > 1 experts are whole, so expert_ffn need not split over tp.
  EXPECT_TRUE(Check("mixtral-8x7b", "bf16", {.tp = 8, .ep = 8}).ok());
}

TEST(LayoutTest, ParseAndPrint) {
  Parallelism p = *ParseParallelism("tp=2,pp=3,ep=2");
  EXPECT_EQ(p, (Parallelism{.tp = 2, .pp = 3, .ep = 2}));
  EXPECT_EQ(p.ToString(), "tp2 pp3 ep2");
  EXPECT_EQ(Parallelism{}.ToString(), "tp1");
  EXPECT_EQ(p.devices(), 6);
  EXPECT_FALSE(ParseParallelism("tp=0").ok());
  EXPECT_FALSE(ParseParallelism("tp2").ok());
  EXPECT_FALSE(ParseParallelism("xp=2").ok());
  EXPECT_FALSE(ParseParallelism("tp=2x").ok());
  Layout pd{{.dp = 4}, Parallelism{.tp = 4}};
  EXPECT_EQ(pd.ToString(), "P[tp4] D[dp4]");
  EXPECT_EQ(pd.devices(), 8);
}

TEST(LayoutTest, StageLayersAreBalancedFirstStagesLonger) {
  EXPECT_EQ(StageLayers(22, 4, 0).size(), 6);
  EXPECT_EQ(StageLayers(22, 4, 1).first, 6);
  EXPECT_EQ(StageLayers(22, 4, 1).size(), 6);
  EXPECT_EQ(StageLayers(22, 4, 2).size(), 5);
  EXPECT_EQ(StageLayers(22, 4, 3).end, 22);
}

TEST(LayoutTest, DeviceCountAgainstTheCluster) {
  const Cluster c = *ClusterPreset("8xh100");
  const ModelShape m = *ModelPreset("llama-3-8b");
  Status s = ValidateLayout(m, c, *ParseDType("bf16"), {{.tp = 8, .dp = 2}, std::nullopt});
  EXPECT_NE(Message(s).find("needs 16 devices; the cluster has 8"), std::string::npos)
      << Message(s);
}

TEST(LayoutTest, EnumerationKeepsOnlyValidLayouts) {
  const Cluster c = *ClusterPreset("8xh100");
  const ModelShape m = *ModelPreset("llama-3-8b");
  const DType bf16 = *ParseDType("bf16");
  const std::vector<Layout> all = EnumerateLayouts(m, c, bf16, {});
  EXPECT_FALSE(all.empty());
  for (const Layout& l : all) {
    EXPECT_TRUE(ValidateLayout(m, c, bf16, l).ok()) << l.ToString();
    EXPECT_EQ(l.decode.ep, 1);  // dense
  }
  auto has = [&](const std::vector<Layout>& ls, Parallelism p) {
    return std::any_of(ls.begin(), ls.end(), [&](const Layout& l) { return l.decode == p; });
  };
  EXPECT_TRUE(has(all, {.tp = 8}));
  EXPECT_TRUE(has(all, {.tp = 2, .pp = 2, .dp = 2}));
  EXPECT_FALSE(has(all, {.tp = 3}));
  const std::vector<Layout> moe = EnumerateLayouts(*ModelPreset("mixtral-8x7b"), c, bf16, {});
  EXPECT_TRUE(has(moe, {.tp = 4, .dp = 2, .ep = 8}));
  EnumerateOptions pd;
  pd.prefill_decode_split = true;
  const std::vector<Layout> split = EnumerateLayouts(m, c, bf16, pd);
  EXPECT_TRUE(std::any_of(split.begin(), split.end(), [](const Layout& l) {
    return l.prefill && *l.prefill == Parallelism{.tp = 4} && l.decode == Parallelism{.dp = 4};
  }));
}

}  // namespace
}  // namespace tessera::plan
