#include "kernels/rate_probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "test_util.h"

namespace tessera::kernels {
namespace {

using testing::MakeRandomWeights;
using testing::RandomFloats;

constexpr WeightType kAllTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16,
                                    WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K,
                                    WeightType::kQ6_K};

// The probe at test size: three 264 × 512 matrices (a row count that is not a power
// of two, two K-quant super-blocks a row), a sweep over rows of 1–3 super-blocks and
// 64-row matrices, a few milliseconds a figure.
RateProbeOptions Small(WeightType type) {
  RateProbeOptions options;
  options.matrix_rows = 264;
  options.matrix_cols = 512;
  options.stream_bytes = 3 * 264 * *RowBytes(type, 512);
  options.gemm_dim = 256;
  options.gemm_tokens = 8;
  options.seconds = 0.002;
  options.sweep_cols = {256, 512, 768};
  options.short_rows = 64;
  return options;
}

bool PositiveAndFinite(double x) { return std::isfinite(x) && x > 0; }

// Every figure `plan --calibrate` records, for every weight type: the streamed
// matrices are laid out as the loader lays them out (Q4_K's interleaved rows are
// larger than its GGUF rows: sized for the GGUF rows, the packing wrote past the end
// of the buffer, which the sanitizer pass reports).
TEST(RateProbeTest, EveryWeightTypeGivesPositiveFiniteRates) {
  ThreadPool pool(2);
  for (WeightType type : kAllTypes) {
    SCOPED_TRACE(TraitsOf(type).name);
    const KernelRates rates = MeasureKernelRates(type, pool, Small(type));
    EXPECT_TRUE(PositiveAndFinite(rates.gemv_bytes_per_s)) << rates.gemv_bytes_per_s;
    EXPECT_TRUE(PositiveAndFinite(rates.gemv_all_bytes_per_s)) << rates.gemv_all_bytes_per_s;
    EXPECT_TRUE(PositiveAndFinite(rates.gemm_flops)) << rates.gemm_flops;
    for (const auto* by_rows : {&rates.rows_bytes_per_s, &rates.rows_all_bytes_per_s}) {
      ASSERT_EQ(by_rows->size(), 2u);
      for (int64_t rows : {4, 16}) {
        ASSERT_TRUE(by_rows->contains(rows)) << rows;
        EXPECT_TRUE(PositiveAndFinite(by_rows->at(rows))) << rows << ": " << by_rows->at(rows);
      }
    }
    EXPECT_TRUE(std::isfinite(rates.call_seconds) && rates.call_seconds >= 0);
    EXPECT_TRUE(std::isfinite(rates.call_all_seconds) && rates.call_all_seconds >= 0);
    for (const auto* by_cols : {&rates.cols_bytes_per_s, &rates.cols_all_bytes_per_s}) {
      ASSERT_EQ(by_cols->size(), 3u);
      for (int64_t cols : {256, 512, 768}) {
        ASSERT_TRUE(by_cols->contains(cols)) << cols;
        EXPECT_TRUE(PositiveAndFinite(by_cols->at(cols))) << cols << ": " << by_cols->at(cols);
      }
    }
  }
}

// The stream's bytes: whole matrices filling stream_bytes, counted as the kernel reads
// them (the engine's layout, what a model's decode bytes count) and as GGUF stores
// them (what the planner's sizes count).
TEST(RateProbeTest, StreamBytesAreThoseOfTheEngineLayoutAndOfTheFile) {
  for (WeightType type : kAllTypes) {
    SCOPED_TRACE(TraitsOf(type).name);
    const RateProbeOptions options = Small(type);
    const WeightStreamProbe probe(type, options);
    EXPECT_EQ(probe.gguf_bytes(), options.stream_bytes);
    EXPECT_EQ(probe.read_bytes(), 3 * 264 * Interleaved8RowBytes(type, 512));
    EXPECT_TRUE(PositiveAndFinite(probe.SecondsPerPass(1, nullptr)));
  }
  const WeightStreamProbe q4k(WeightType::kQ4_K, Small(WeightType::kQ4_K));
  EXPECT_EQ(q4k.read_bytes() * 144, q4k.gguf_bytes() * 148);
  // Less than one matrix asked for: one matrix.
  RateProbeOptions tiny = Small(WeightType::kF32);
  tiny.stream_bytes = 1;
  EXPECT_EQ(WeightStreamProbe(WeightType::kF32, tiny).gguf_bytes(), 264 * 512 * 4);
}

// EngineLayout multiplies like the matrix it was given (interleaving keeps the bits),
// in the loader's layout where the kernel takes one, as it is otherwise.
TEST(RateProbeTest, EngineLayoutKeepsTheProduct) {
  std::mt19937 rng(38);
  for (WeightType type : kAllTypes) {
    for (int64_t rows : {16, 13}) {
      SCOPED_TRACE(std::string(TraitsOf(type).name) + " rows " + std::to_string(rows));
      const int64_t cols = 512, tokens = 3;
      const testing::RandomWeights w = MakeRandomWeights(rng, type, rows, cols);
      HugePageBuffer packed;
      const WeightView engine = EngineLayout(w.view, &packed);
      EXPECT_EQ(engine.layout, rows % 8 == 0 ? WeightLayout::kInterleaved8 : WeightLayout::kRows);
      if (rows % 8 == 0) {
        EXPECT_EQ(packed.size(), static_cast<size_t>(rows * Interleaved8RowBytes(type, cols)));
      }
      const std::vector<float> x = RandomFloats(rng, tokens * cols);
      std::vector<float> want(tokens * rows), got(tokens * rows);
      MatMul(w.view, x.data(), tokens, want.data());
      MatMul(engine, x.data(), tokens, got.data());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace tessera::kernels
