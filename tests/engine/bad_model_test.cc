// Bad model files — missing, empty, truncated, corrupted header, a tensor of the
// wrong shape — give a clear error from LoadModel and an error exit (code 1 with
// a message) from `tessera generate`, never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::HaveModel;
using testing::ModelPath;

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

std::string WriteTemp(const std::string& name, const std::vector<char>& bytes) {
  const std::string path = ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

CliResult RunCli(const std::string& args) {
  CliResult result;
  const std::string cmd = std::string(TESSERA_CLI_PATH) + " " + args + " 2>&1";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

class BadModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
    good_ = ReadAll(ModelPath("stories260K.gguf"));
    ASSERT_GT(good_.size(), 1000u);
  }
  void TearDown() override {
    for (const std::string& path : temps_) std::filesystem::remove(path);
  }
  std::string Temp(const std::string& name, const std::vector<char>& bytes) {
    temps_.push_back(WriteTemp(name, bytes));
    return temps_.back();
  }
  // LoadModel fails with a message containing `expected`; so does the CLI (exit 1).
  void ExpectRejected(const std::string& path, const std::string& expected) {
    auto loaded = LoadModel(path);
    ASSERT_FALSE(loaded.ok()) << path << " loaded";
    EXPECT_NE(loaded.status().message().find(expected), std::string::npos)
        << loaded.status().ToString();
    const CliResult cli = RunCli("generate " + path + " -p 'Once' -n 4");
    EXPECT_EQ(cli.exit_code, 1) << cli.output;
    EXPECT_NE(cli.output.find("tessera generate: error:"), std::string::npos) << cli.output;
    EXPECT_NE(cli.output.find(expected), std::string::npos) << cli.output;
  }

  std::vector<char> good_;
  std::vector<std::string> temps_;
};

TEST_F(BadModelTest, MissingFile) {
  ExpectRejected(::testing::TempDir() + "/no_such_model.gguf", "no_such_model.gguf");
}

TEST_F(BadModelTest, EmptyFile) { ExpectRejected(Temp("empty.gguf", {}), "empty.gguf"); }

TEST_F(BadModelTest, CorruptedMagic) {
  std::vector<char> bytes = good_;
  std::memcpy(bytes.data(), "GGUX", 4);
  ExpectRejected(Temp("magic.gguf", bytes), "magic");
}

TEST_F(BadModelTest, TruncatedInTheHeader) {
  std::vector<char> bytes(good_.begin(), good_.begin() + 300);
  ExpectRejected(Temp("trunc_header.gguf", bytes), "trunc_header.gguf");
}

TEST_F(BadModelTest, TruncatedInTheTensorData) {
  std::vector<char> bytes(good_.begin(), good_.begin() + static_cast<ptrdiff_t>(good_.size() / 2));
  ExpectRejected(Temp("trunc_data.gguf", bytes), "trunc_data.gguf");
}

TEST_F(BadModelTest, TensorOfTheWrongShape) {
  // blk.0.attn_q.weight is [64, 64]; make its second dim 32 (the data still fits).
  std::vector<char> bytes = good_;
  const std::string name = "blk.0.attn_q.weight";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  char* info = &*it + name.size();  // u32 n_dims, u64 dims[n_dims]
  uint32_t n_dims;
  std::memcpy(&n_dims, info, 4);
  ASSERT_EQ(n_dims, 2u);
  uint64_t dims[2];
  std::memcpy(dims, info + 4, 16);
  ASSERT_EQ(dims[1], 64u);
  dims[1] = 32;
  std::memcpy(info + 4, dims, 16);
  ExpectRejected(Temp("shape.gguf", bytes), "blk.0.attn_q.weight");
}

TEST(GenerateCliTest, RejectsBadFlags) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  const std::string model = ModelPath("stories260K.gguf");
  CliResult r = RunCli("generate " + model + " -p hi -n 2 --kv-type q8_0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--kv-type must be f32 or f16"), std::string::npos) << r.output;
  r = RunCli("generate " + model + " -p hi -n 2 --top-p 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("top_p"), std::string::npos) << r.output;
  r = RunCli("generate " + model + " -p hi -n 3 --prefill-chunk -1");  // 0: the default
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--prefill-chunk must be at least 0"), std::string::npos) << r.output;
  // A prompt the KV cache cannot hold is refused before any step.
  r = RunCli("generate " + model +
             " -p 'once upon a time there was a very long prompt' -n 4 --ctx 8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("leave no room in the context of 16 tokens"), std::string::npos)
      << r.output;
}

TEST(GenerateCliTest, StopsAtTheContextLengthWithAMessage) {
  // -n past the context (here the KV cache's one 16-token block) generates up to it
  // and says so, as serve does with max_tokens.
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  const CliResult r =
      RunCli("generate " + ModelPath("stories260K.gguf") + " -p hi -n 40 --ctx 8 --temp 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("-n 40 stops at the context length: 16 tokens (prompt 3 + 13 new)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("generated 13 tokens"), std::string::npos) << r.output;
}

TEST(GenerateCliTest, InvalidPlanIsOneLineBeforeAnyRankStarts) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  const std::string model = ModelPath("stories260K.gguf");
  for (const auto& [flags, message] :
       {std::pair<std::string, std::string>{"--tp 3", "tp (3) must divide the 8 query heads"},
        {"--pp 9", "exceeds the model's 5 layers"}}) {
    const CliResult r = RunCli("generate " + model + " -p hi -n 2 " + flags);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const size_t first = r.output.find(message);
    EXPECT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(message, first + 1), std::string::npos) << "printed twice:\n"
                                                                    << r.output;
    EXPECT_EQ(r.output.find("a rank failed"), std::string::npos) << r.output;
  }
}

// --cp with --ep or --sp is refused before any rank starts, naming the option.
TEST(GenerateCliTest, ContextParallelRefusesEpAndSp) {
  if (!HaveModel("stories260K-moe4x2.gguf")) GTEST_SKIP() << "no shared models";
  for (const auto& [flags, message] :
       {std::pair<std::string, std::string>{ModelPath("stories260K-moe4x2.gguf") + " --cp 2 --ep 2",
                                            "--cp is not supported with --ep"},
        {ModelPath("stories260K-moe4x2.gguf") + " --cp 2 --tp 2 --ep 2",
         "--cp is not supported with --ep"},
        {ModelPath("stories260K.gguf") + " --cp 2 --tp 2 --sp",
         "--cp is not supported with --sp"}}) {
    const CliResult r = RunCli("generate " + flags + " -p hi -n 2");
    EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.output;
    const size_t first = r.output.find(message);
    EXPECT_NE(first, std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find(message, first + 1), std::string::npos) << "printed twice:\n"
                                                                    << r.output;
    EXPECT_EQ(r.output.find("a rank failed"), std::string::npos) << r.output;
  }
  // The flag parser's range check (CLI11's own message and exit code, as for --tp 0).
  const CliResult r = RunCli("generate " + ModelPath("stories260K.gguf") + " -p hi -n 2 --cp 0");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("--cp: ", 0), 0u) << r.output;
}

// A 574-token prompt with a KV cache of 400 tokens a rank: one rank refuses it,
// --cp 2 holds it over two (rank 0 span 0, rank 1 spans 1 and 2) and writes the
// logits a one-rank run with room for it writes, bit for bit.
TEST(GenerateCliTest, ContextParallelServesAPromptBeyondOneRanksPool) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  std::string text;
  for (int i = 0; i < 22; ++i) {
    text += "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
  }
  const std::string generate =
      "generate " + ModelPath("stories260K.gguf") + " -p '" + text + "' --temp 0 -n 4 ";
  const std::string prefix = ::testing::TempDir() + "/" + std::to_string(getpid());
  CliResult r = RunCli(generate + "--kv-tokens 400");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the prompt's 574 tokens leave no room in the context of 400 tokens"),
            std::string::npos)
      << r.output;
  r = RunCli(generate + "--kv-tokens 400 --cp 2 --ledger --dump-logits " + prefix + "_cp2.f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("prompt 574 tokens"), std::string::npos) << r.output;
  // The whole prompt in one split step (the group holds it), not a second unsplit chunk.
  EXPECT_NE(r.output.find("step 0 prefill: 1 sequence, 574 new tokens"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("not modelled"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("generated 4 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tp1 cp2 pp1"), std::string::npos) << r.output;
  // The per-rank report names each rank's cp rank: rank 1 is stage 0, tp 0, cp 1.
  EXPECT_NE(r.output.find("rank stage tp cp "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n   1     0  0  1 "), std::string::npos) << r.output;
  r = RunCli(generate + "--kv-tokens 1024 --dump-logits " + prefix + "_one.f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<char> one = ReadAll(prefix + "_one.f32");
  const std::vector<char> cp2 = ReadAll(prefix + "_cp2.f32");
  EXPECT_EQ(one.size(), 4u * 512u * sizeof(float));
  EXPECT_TRUE(one == cp2) << "--cp 2 logits differ from one rank's";
  std::filesystem::remove(prefix + "_one.f32");
  std::filesystem::remove(prefix + "_cp2.f32");
}

TEST(GenerateCliTest, DefaultContextCoversTheBatch) {
  // Every sequence's prompt + tokens in whole blocks: 16 copies of a short prompt and
  // 32 tokens each fit without --ctx (the cache once came 9 blocks short).
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  const CliResult r = RunCli("generate " + ModelPath("stories260K.gguf") +
                             " -p Hello -n 32 --batch 16 --temp 0 --ignore-eos");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("generated 512 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--- sequence 15 ---"), std::string::npos) << r.output;
}

TEST(GenerateCliTest, GreedyStreamsTheGoldenTextAndAStatsLine) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  const std::string dump = ::testing::TempDir() + "/" + std::to_string(getpid()) + "_logits.f32";
  const CliResult r = RunCli("generate " + ModelPath("stories260K.gguf") +
                             " -p 'Once upon a time' -n 32 --temp 0 -t 2 --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Once upon a time, there was a little girl named Lily. She loved to play "
                          "outside in the park. One day, she saw"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("prompt 5 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("generated 32 tokens"), std::string::npos) << r.output;
  EXPECT_EQ(std::filesystem::file_size(dump), 32u * 512u * sizeof(float));
  std::filesystem::remove(dump);
}

TEST(GenerateCliTest, SamplingIsReproducibleForASeed) {
  if (!HaveModel("stories260K.gguf")) GTEST_SKIP() << "stories260K.gguf is not present";
  auto run = [](int seed, int threads) {
    CliResult r = RunCli("generate " + ModelPath("stories260K.gguf") +
                         " -p 'Once upon a time' -n 48 --temp 1.0 --top-k 0 --top-p 0.95 " +
                         "--min-p 0.02 --repeat-penalty 1.1 --seed " + std::to_string(seed) +
                         " -t " + std::to_string(threads) + " --no-display-prompt");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output.substr(0, r.output.find("prompt 5 tokens"));  // text before the stats
  };
  const std::string a = run(7, 1);
  EXPECT_EQ(a, run(7, 2));
  EXPECT_NE(a, run(8, 1));
}

}  // namespace
}  // namespace tessera::engine
