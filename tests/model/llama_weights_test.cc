// BindLlamaWeights when memory runs out: a copy out of the file (a matrix repacked
// for the matmul, a norm) that the kernel refuses to map is an error naming the
// tensor, not an abort.
#include "model/llama_weights.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/proc_status.h"
#include "model/config.h"
#include "model/gguf.h"
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

  // In a child limited to 16 MiB more address space than it has: the repacked
  // matrices' first 32 MiB chunk cannot be mapped.
  const auto bind_limited = [&] {
    const auto mapped = static_cast<size_t>(ProcStatusBytes("VmSize"));
    if (mapped == 0) std::_Exit(2);
    const rlimit limit{mapped + (size_t{16} << 20), mapped + (size_t{16} << 20)};
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
    Result<LlamaWeights> w = BindLlamaWeights(*file, *config);
    if (w.ok()) std::_Exit(4);
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    std::_Exit(w.status().code() == StatusCode::kResourceExhausted ? 0 : 5);
  };
  EXPECT_EXIT(bind_limited(), ::testing::ExitedWithCode(0),
              "no memory for [a-z0-9_.]+ \\([0-9]+ bytes, [a-z ]+\\): cannot map");
}

}  // namespace
}  // namespace tessera::model
