// BindLlamaWeights when memory runs out: copying a matrix out for the matmul
// (repacking) that the kernel refuses to map is an error naming the tensor, not an
// abort.
#include "model/llama_weights.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "model/config.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "test_util.h"

namespace tessera::model {
namespace {

// This process's mapped address space (VmSize), bytes; 0 if unknown.
size_t MappedBytes() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "VmSize: %zu kB", &kib) == 1) break;
  }
  std::fclose(status);
  return kib * 1024;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // their allocators map memory of their own
#else
constexpr bool kSanitized = false;
#endif

TEST(LlamaWeightsTest, NoMemoryForTheRepackedMatricesIsAnErrorNamingTheTensor) {
  if (kSanitized) GTEST_SKIP() << "an address-space limit breaks the sanitizer's allocator";
  SynthOptions o;
  o.dim = 256;
  o.num_layers = 2;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.ffn_dim = 512;
  o.type = kernels::WeightType::kQ8_0;
  o.seed = 3;
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
    const size_t mapped = MappedBytes();
    if (mapped == 0) std::_Exit(2);
    const rlimit limit{mapped + (size_t{16} << 20), mapped + (size_t{16} << 20)};
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
    Result<LlamaWeights> w = BindLlamaWeights(*file, *config);
    if (w.ok()) std::_Exit(4);
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    std::_Exit(w.status().code() == StatusCode::kResourceExhausted ? 0 : 5);
  };
  EXPECT_EXIT(bind_limited(), ::testing::ExitedWithCode(0),
              "no memory for blk\\.0\\..*repacked for the matmul.*cannot map");
}

}  // namespace
}  // namespace tessera::model
