// Batch invariance, required by the correctness contract: a sequence's logits are
// bit-identical whether it runs alone or in a batch of 1..16 sequences of
// different lengths, whatever the prefill chunk size (1, 7, 64), with prefill and
// decode mixed in one step, for dense, MoE and quantised models and both KV types.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_models.h"

namespace tessera::engine {
namespace {

using testing::HaveModel;
using testing::ModelPath;

constexpr int kMaxSequences = 16;

// Token streams of different lengths (2..90), fixed by the seed.
std::vector<std::vector<int32_t>> MakeSequences(int64_t vocab) {
  std::mt19937 rng(2024);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < kMaxSequences; ++i) {
    const int length = 2 + static_cast<int>(rng() % 89);
    std::vector<int32_t>& seq = out.emplace_back();
    seq.push_back(1);  // BOS
    for (int j = 1; j < length; ++j) seq.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return out;
}

// Runs `sequences` together: at each step every started, unfinished sequence
// feeds its next min(chunk, left) tokens; sequence i starts at step i % 3, so
// prefill chunks and single decode-like tokens mix. Returns each sequence's
// logits for every one of its tokens ([length, vocab]).
std::vector<std::vector<float>> RunBatched(const LoadedModel& loaded,
                                           const std::vector<std::vector<int32_t>>& sequences,
                                           int64_t chunk, kernels::KvType kv_type, int threads) {
  ThreadPool pool(threads);
  int64_t total = 0;
  for (const auto& s : sequences) total += static_cast<int64_t>(s.size()) + 16;
  testing::TestCache cache(loaded.model->config(), kv_type, total);
  testing::LocalRunner local(*loaded.model, cache.cache, pool);
  StepExecutor& runner = local.driver;
  const size_t vocab = static_cast<size_t>(runner.vocab_size());
  std::vector<kv::BlockTable> tables;
  for (size_t i = 0; i < sequences.size(); ++i) tables.emplace_back(cache.cache.shape().block_size);
  std::vector<size_t> fed(sequences.size(), 0);
  std::vector<std::vector<float>> logits(sequences.size());
  for (int step = 0;; ++step) {
    std::vector<StepEntry> entries;
    std::vector<size_t> members;
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (static_cast<int>(i % 3) > step || fed[i] == sequences[i].size()) continue;
      const size_t count =
          std::min<size_t>(static_cast<size_t>(chunk), sequences[i].size() - fed[i]);
      TESSERA_CHECK(tables[i].Reserve(cache.allocator, static_cast<int64_t>(fed[i] + count)).ok());
      entries.push_back(
          {.new_tokens = std::span<const int32_t>(sequences[i]).subspan(fed[i], count),
           .start_position = static_cast<int64_t>(fed[i]),
           .block_table = &tables[i]});
      members.push_back(i);
    }
    if (entries.empty() && step >= 3) break;
    if (entries.empty()) continue;
    auto result = runner.Step(entries, /*all_logits=*/true);
    TESSERA_CHECK(result.ok()) << result.status().ToString();
    size_t row = 0;
    for (size_t e = 0; e < entries.size(); ++e) {
      const size_t i = members[e];
      const size_t count = entries[e].new_tokens.size();
      logits[i].insert(logits[i].end(), result->begin() + static_cast<ptrdiff_t>(row * vocab),
                       result->begin() + static_cast<ptrdiff_t>((row + count) * vocab));
      row += count;
      fed[i] += count;
    }
  }
  for (auto& table : tables) table.Release(cache.allocator);
  return logits;
}

// The first position where two logit streams differ in any bit, or -1.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b, size_t vocab) {
  if (a.size() != b.size()) return 0;
  for (size_t pos = 0; pos * vocab < a.size(); ++pos) {
    if (std::memcmp(&a[pos * vocab], &b[pos * vocab], vocab * sizeof(float)) != 0) {
      return static_cast<int64_t>(pos);
    }
  }
  return -1;
}

using Param = std::tuple<const char*, kernels::KvType>;
class BatchInvarianceTest : public ::testing::TestWithParam<Param> {};

TEST_P(BatchInvarianceTest, LogitsAreBitIdenticalAloneOrBatchedForEveryChunkSize) {
  const std::string name = std::get<0>(GetParam());
  const kernels::KvType kv_type = std::get<1>(GetParam());
  if (!HaveModel(name)) GTEST_SKIP() << ModelPath(name) << " is not present";
  auto loaded = LoadModel(ModelPath(name));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const auto sequences = MakeSequences(loaded->model->config().vocab_size);
  const size_t vocab = static_cast<size_t>(loaded->model->config().vocab_size);

  // Reference: each sequence alone, one thread, whole sequence in one step.
  std::vector<std::vector<float>> alone;
  for (const auto& seq : sequences) {
    alone.push_back(RunBatched(*loaded, {seq}, /*chunk=*/1 << 20, kv_type, 1)[0]);
  }
  for (int64_t chunk : {1, 7, 64}) {
    for (int batch_size : {1, 2, 3, 5, 8, 11, 16}) {
      std::vector<std::vector<int32_t>> batch(sequences.begin(), sequences.begin() + batch_size);
      const auto batched = RunBatched(*loaded, batch, chunk, kv_type, 2);
      for (int i = 0; i < batch_size; ++i) {
        const int64_t diff =
            FirstDifference(batched[static_cast<size_t>(i)], alone[static_cast<size_t>(i)], vocab);
        ASSERT_EQ(diff, -1) << name << ": sequence " << i << " (" << sequences[i].size()
                            << " tokens) in a batch of " << batch_size << ", chunk " << chunk
                            << ": logits differ first at position " << diff;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, BatchInvarianceTest,
    ::testing::Values(Param{"stories260K.gguf", kernels::KvType::kF32},
                      Param{"stories260K.gguf", kernels::KvType::kF16},
                      Param{"stories260K-moe4x2.gguf", kernels::KvType::kF16},
                      Param{"stories260K-ffn192-Q8_0.gguf", kernels::KvType::kF16},
                      Param{"stories260K-ffn192-Q4_0.gguf", kernels::KvType::kF32},
                      Param{"stories260K-F16.gguf", kernels::KvType::kF16}),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      name = name.substr(0, name.size() - 5) + "_kv_" +
             std::string(std::get<1>(info.param) == kernels::KvType::kF16 ? "f16" : "f32");
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

}  // namespace
}  // namespace tessera::engine
