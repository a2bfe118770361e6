// `tessera plan` as a user runs it: exit codes and messages for good and bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

CliRun Plan(const std::string& args) {
  const std::string command = std::string(TESSERA_BIN) + " plan " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  CliRun run;
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) run.output.append(buf.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST(PlanCliTest, PlansAPresetOnAPresetCluster) {
  const CliRun run = Plan("--model llama-3-70b --cluster 8xh100 --concurrency 8 --top 3");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("Best for latency: tp8"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("seeds: C_TP = 2*B*S*H/P"), std::string::npos) << run.output;
}

TEST(PlanCliTest, JsonIsParseable) {
  const CliRun run = Plan(
      "--model mixtral-8x7b --cluster 8xh100 --goal throughput --json --top 2 "
      "--act-dtype bf16");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  EXPECT_EQ(j["goal"], "throughput");
  ASSERT_EQ(j["layouts"].size(), 2u);
  EXPECT_GT(j["layouts"][0]["throughput_tokens_per_s"].get<double>(), 0);
}

TEST(PlanCliTest, OneLayoutAndASplit) {
  CliRun run = Plan("--model llama-3-8b --cluster 2x8xh100-ib --layout tp=2,pp=2");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("layout tp2 pp2 (4 devices)"), std::string::npos) << run.output;
  run = Plan(
      "--model llama-3-8b --cluster 2x8xh100-ib --layout dp=8 --prefill-layout tp=8 "
      "--prompt 4096");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("KV transfer"), std::string::npos) << run.output;
}

TEST(PlanCliTest, BadInputExitsTwoNamingTheConstraint) {
  CliRun run = Plan("--model gpt-9");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("unknown model preset 'gpt-9'"), std::string::npos) << run.output;
  run = Plan("--model llama-3-8b --cluster 2x8xh100-ib --inter 0:5");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("bandwidth must be positive"), std::string::npos) << run.output;
  run = Plan("--model llama-3-8b --device-memory -80");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("device memory must be positive"), std::string::npos) << run.output;
  run = Plan("--model llama-3-8b --layout tp=3");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("tp (3) must divide the query heads (32)"), std::string::npos)
      << run.output;
  run = Plan("--model llama-3-8b --cluster no-such-cluster");
  EXPECT_EQ(run.exit_code, 2);
  run = Plan("--model llama-3-8b --kv-dtype f12");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("unknown dtype 'f12'"), std::string::npos) << run.output;
}

TEST(PlanCliTest, FollowsCommsAlgorithmKnob) {
  // One Llama-3-8B decode token over tp=2 is 16 KiB: one-shot through shared
  // memory by default, recursive doubling when TESSERA_TRANSPORT=tcp takes the
  // mailbox away; a 512-token prefill takes the deterministic two-shot when
  // TESSERA_ALLREDUCE_ALGO asks for it.
  CliRun run = Plan("--model llama-3-8b --layout tp=2");
  EXPECT_NE(run.output.find("one-shot           layer outputs"), std::string::npos) << run.output;
  setenv("TESSERA_TRANSPORT", "tcp", 1);
  run = Plan("--model llama-3-8b --layout tp=2");
  unsetenv("TESSERA_TRANSPORT");
  EXPECT_NE(run.output.find("recursive-doubling layer outputs"), std::string::npos) << run.output;
  setenv("TESSERA_ALLREDUCE_ALGO", "deterministic", 1);
  run = Plan("--model llama-3-8b --layout tp=2");
  unsetenv("TESSERA_ALLREDUCE_ALGO");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("two-shot           layer outputs"), std::string::npos) << run.output;
}

TEST(PlanCliTest, NothingFitsExitsThree) {
  const CliRun run = Plan("--model llama-3-405b --cluster 4xdesktop-1gbe");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("no layout of 'llama-3-405b' fits"), std::string::npos) << run.output;
}

TEST(PlanCliTest, ReadsAGgufForItsShape) {
  const std::string path = std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf";
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "no " << path;
  }
  const CliRun run = Plan("--model " + path + " --cluster 4xdesktop-1gbe --json --top 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(run.output);
  EXPECT_EQ(j["model"]["layers"], 5);
  EXPECT_EQ(j["model"]["hidden"], 64);
  EXPECT_EQ(j["model"]["kv_heads"], 4);
  EXPECT_EQ(j["model"]["vocab"], 512);
  EXPECT_EQ(j["workload"]["weight_dtype"], "f32");
}

}  // namespace

namespace {

TEST(PlanCliTest, PlotsAPng) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  }
  const std::string png = ::testing::TempDir() + "/plan_cli_test.png";
  std::remove(png.c_str());
  const CliRun run = Plan("--model llama-3-8b --cluster 8xh100 --top 3 --plot " + png);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  FILE* f = std::fopen(png.c_str(), "rb");
  ASSERT_NE(f, nullptr) << run.output;
  unsigned char magic[8] = {};
  const size_t n = std::fread(magic, 1, sizeof(magic), f);
  std::fclose(f);
  std::remove(png.c_str());
  ASSERT_EQ(n, sizeof(magic));
  EXPECT_EQ(magic[1], 'P');
  EXPECT_EQ(magic[2], 'N');
  EXPECT_EQ(magic[3], 'G');
}

}  // namespace
