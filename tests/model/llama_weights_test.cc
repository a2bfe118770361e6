// BindLlamaWeights when memory runs out: a copy out of the file (a matrix repacked
// for the matmul, a norm) that the kernel refuses to map is an error naming the
// tensor, not an abort.
#include "model/llama_weights.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/proc_status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/llama_blocks.h"
#include "model/synth.h"
#include "test_util.h"

namespace tessera::model {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // their allocators map memory of their own
#else
constexpr bool kSanitized = false;
#endif

TEST(LlamaWeightsTest, NoMemoryForTheCopiedWeightsIsAnErrorNamingTheTensor) {
  if (kSanitized) GTEST_SKIP() << "an address-space limit breaks the sanitizer's allocator";
  const SynthOptions o{.dim = 256,
                       .num_layers = 2,
                       .num_heads = 4,
                       .num_kv_heads = 2,
                       .ffn_dim = 512,
                       .type = kernels::WeightType::kQ8_0,
                       .seed = 3};
  const std::string path = testing::TempPath("weights_no_memory.gguf");
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> config = ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  // Unlimited, it binds.
  ASSERT_TRUE(BindLlamaWeights(*file, *config).ok());

  // In a child limited to 256 KiB more address space than it has: the repacked
  // matrices' one chunk (1.4 MB) cannot be mapped.
  const auto bind_limited = [&] {
    const auto mapped = static_cast<size_t>(ProcStatusBytes("VmSize"));
    if (mapped == 0) std::_Exit(2);
    const rlimit limit{mapped + (size_t{256} << 10), mapped + (size_t{256} << 10)};
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
    Result<LlamaWeights> w = BindLlamaWeights(*file, *config);
    if (w.ok()) std::_Exit(4);
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    std::_Exit(w.status().code() == StatusCode::kResourceExhausted ? 0 : 5);
  };
  EXPECT_EXIT(bind_limited(), ::testing::ExitedWithCode(0),
              "no memory for [a-z0-9_.]+ \\([0-9]+ bytes, [a-z ]+\\): cannot map");
}

// A head tied to the embedding is one matrix, interleaved for the matmul: the head and
// the lookup share its bytes, and the lookup's rows (read back from the groups) are
// the file's.
TEST(LlamaWeightsTest, TiedHeadIsOneInterleavedMatrix) {
  const SynthOptions o{.dim = 256,
                       .num_layers = 1,
                       .num_heads = 4,
                       .ffn_dim = 512,
                       .vocab_size = 320,
                       .type = kernels::WeightType::kQ8_0,
                       .seed = 5,
                       .tied_output = true};
  const std::string path = testing::TempPath("weights_tied.gguf");
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> config = ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->tied_output);
  Result<LlamaWeights> w = BindLlamaWeights(*file, *config);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->output.layout, kernels::WeightLayout::kInterleaved8);
  EXPECT_EQ(w->output.data.data(), w->token_embd.data.data());
  // The byte counts are the matrices' as bound (interleaved), the shared head once.
  int64_t layers = 0;
  for (const LlamaLayerWeights& l : w->layers) {
    for (const WeightMatrix* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      layers += static_cast<int64_t>(m->data.size());
    }
  }
  const auto embd_bytes = static_cast<int64_t>(w->token_embd.data.size());
  EXPECT_EQ(w->total_bytes, layers + embd_bytes);
  EXPECT_EQ(w->decode_bytes_per_token, layers + embd_bytes + embd_bytes / 320);
  // Every matrix is Q8_0 (the norms are not matrices): all of it by type.
  EXPECT_EQ(w->decode_bytes_by_type, (std::map<kernels::WeightType, int64_t>{
                                         {kernels::WeightType::kQ8_0, w->decode_bytes_per_token}}));
  const GgufTensor* embd = file->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  const size_t row_bytes = embd->row_bytes();
  std::vector<uint8_t> row(row_bytes);
  for (int64_t r = 0; r < 320; ++r) {
    kernels::GgufRow(w->token_embd.view(), r, row.data());
    ASSERT_EQ(std::memcmp(row.data(), embd->data.data() + r * row_bytes, row_bytes), 0) << r;
  }
}

// The blocks' tile: the largest power of two in [64, 512] tokens whose activations
// (h, q, k, v, attn, proj, gate, up) stay under 1/48 of the weight bytes.
// An MoE decode step reads experts_used of each layer's experts, and its f32 router:
// the bytes by type add up to the total (bench model's roofline weighs each type by
// its own GEMV rate).
TEST(LlamaWeightsTest, DecodeBytesByTypeOfAnMoeModel) {
  const SynthOptions o{.moe = true,
                       .dim = 64,
                       .num_layers = 2,
                       .num_heads = 4,
                       .ffn_dim = 96,
                       .num_experts = 4,
                       .num_experts_used = 2,
                       .type = kernels::WeightType::kQ4_0,
                       .seed = 6};
  const std::string path = testing::TempPath("weights_moe.gguf");
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelConfig> config = ModelConfigFromGguf(*file);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<LlamaWeights> w = BindLlamaWeights(*file, *config);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int64_t router = 2 * 4 * 64 * 4;         // layers × experts × dim × f32
  const int64_t expert = 3 * 96 * 64 / 32 * 18;  // gate, up, down in Q4_0 blocks
  int64_t attn = 0;
  for (const LlamaLayerWeights& l : w->layers) {
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo}) {
      attn += static_cast<int64_t>(m->data.size());
    }
  }
  const auto head = static_cast<int64_t>(w->output.data.size());
  const auto embd_row = static_cast<int64_t>(w->token_embd.row_bytes());
  EXPECT_EQ(w->decode_bytes_by_type.at(kernels::WeightType::kF32), router);
  EXPECT_EQ(w->decode_bytes_by_type.at(kernels::WeightType::kQ4_0),
            attn + 2 * 2 * expert + head + embd_row);
  EXPECT_EQ(w->decode_bytes_by_type.size(), 2u);
  EXPECT_EQ(w->decode_bytes_per_token, router + attn + 2 * 2 * expert + head + embd_row);
}

TEST(BlockTileTokensTest, ActivationsStayASmallFractionOfTheWeights) {
  ModelConfig tiny;  // TinyLlama's shape: 19968 floats = 78 KiB a token
  tiny.dim = 2048;
  tiny.num_heads = 32;
  tiny.num_kv_heads = 4;
  tiny.head_dim = 64;
  tiny.ffn_dim = 5632;
  const int64_t per_token = 19968 * 4;
  EXPECT_EQ(BlockTileTokens(tiny, int64_t{2098} << 20), 512);  // F16
  EXPECT_EQ(BlockTileTokens(tiny, int64_t{1115} << 20), 256);  // Q8_0
  EXPECT_EQ(BlockTileTokens(tiny, int64_t{590} << 20), 128);   // Q4_0
  EXPECT_EQ(BlockTileTokens(tiny, 48 * 256 * per_token), 256);
  EXPECT_EQ(BlockTileTokens(tiny, 48 * 256 * per_token - 1), 128);
  EXPECT_EQ(BlockTileTokens(tiny, int64_t{1} << 40), 512);  // at most 512
  EXPECT_EQ(BlockTileTokens(tiny, 0), 64);                  // at least 64
  ModelConfig small = tiny;                                 // the 110M synth: 136 MiB of Q8_0
  small.dim = 768;
  small.num_heads = small.num_kv_heads = 12;
  small.ffn_dim = 2048;
  EXPECT_EQ(BlockTileTokens(small, int64_t{136} << 20), 64);
}

}  // namespace
}  // namespace tessera::model
