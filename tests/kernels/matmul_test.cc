#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/reference/reference.h"
#include "test_util.h"

namespace tessera::kernels {
namespace {

using testing::BitEqual;
using testing::MakeRandomWeights;
using testing::RandomFloats;

constexpr WeightType kAllTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16,
                                    WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K,
                                    WeightType::kQ6_K};

bool IsQuantised(WeightType type) { return TraitsOf(type).block_elems > 1; }

std::vector<int64_t> ColsFor(WeightType type) {
  switch (TraitsOf(type).block_elems) {
    case 1:
      return {1, 7, 13, 64, 200, 1000};
    case 32:
      return {32, 96, 160, 800};
    default:
      return {256, 768, 2048};
  }
}

TEST(MatMulTest, CanonicalKChunks) {
  EXPECT_EQ(CanonicalKChunks(WeightType::kF32, 2048), 8);
  EXPECT_EQ(CanonicalKChunks(WeightType::kF16, 12), 4);
  EXPECT_EQ(CanonicalKChunks(WeightType::kF16, 7), 1);
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ8_0, 2048), 8);
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ8_0, 96), 1);    // 3 blocks
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ4_0, 5632), 8);  // 176 blocks
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ4_0, 160), 1);
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ4_K, 512), 2);
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ6_K, 5632), 2);  // 22 super-blocks
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ6_K, 768), 1);   // 3 super-blocks
  EXPECT_EQ(CanonicalKChunks(WeightType::kQ6_K, 2048), 8);
}

TEST(MatMulTest, TreeSumOrder) {
  // Tree(0,3) = c0 + (c1 + c2): chosen so the other orders round differently.
  const float c[3] = {1.0f, 0x1p-24f, 0x1p-24f};
  EXPECT_EQ(KChunkTreeSum(c, 0, 3), 1.0f + 0x1p-23f);
  const float d[4] = {1.0f, 0x1p-24f, 0x1p-24f, 0x1p-24f};  // (c0+c1) + (c2+c3)
  EXPECT_EQ(KChunkTreeSum(d, 0, 4), 1.0f + 0x1p-23f);
}

// Against dequantise-then-f32 (double accumulation). Float weights: f32 rounding of
// FMA chains of at most 1000 steps, bounded by 1e-5 · Σ|w·x| for these sizes. Quantised
// weights also see x quantised to q8: |x - x̂| ≤ d_x/2 = amax_block/254 per element,
// so the error is at most Σ|w_k| · amax_block(k)/254 on top.
TEST(MatMulTest, MatchesReferenceAllTypes) {
  testing::ForEachTarget([&] {
    std::mt19937 rng(42);
    ThreadPool pool(2);
    for (WeightType type : kAllTypes) {
      for (int64_t cols : ColsFor(type)) {
        for (int64_t rows : {1, 5, 37}) {
          for (int64_t n_tokens : {1, 2, 7}) {
            auto w = MakeRandomWeights(rng, type, rows, cols);
            std::vector<float> x = RandomFloats(rng, n_tokens * cols);
            std::vector<float> y(n_tokens * rows), ref(n_tokens * rows);
            MatMul(w.view, x.data(), n_tokens, y.data(), {}, &pool);
            reference::MatMul(w.view, x.data(), n_tokens, ref.data());
            std::vector<float> wrow(cols);
            for (int64_t r = 0; r < rows; ++r) {
              DequantizeRow(type, w.view.data + r * w.view.row_bytes, cols, wrow.data());
              for (int64_t t = 0; t < n_tokens; ++t) {
                double abs_sum = 0, quant_bound = 0;
                for (int64_t k = 0; k < cols; ++k) {
                  abs_sum += std::fabs(wrow[k] * x[t * cols + k]);
                  if (IsQuantised(type)) {
                    float amax = 0;
                    const int64_t b = k / 32 * 32;
                    for (int j = 0; j < 32; ++j)
                      amax = std::max(amax, std::fabs(x[t * cols + b + j]));
                    quant_bound += std::fabs(wrow[k]) * amax / 254.0;
                  }
                }
                const double tol = 1e-5 * abs_sum + quant_bound * 1.001 + 1e-30;
                ASSERT_LE(std::fabs(y[t * rows + r] - ref[t * rows + r]), tol)
                    << TraitsOf(type).name << " rows=" << rows << " cols=" << cols
                    << " tokens=" << n_tokens << " r=" << r << " t=" << t;
              }
            }
          }
        }
      }
    }
  });
}

// Quantised types against an exact emulation with the same q8 activations: only the
// kernel's f32 accumulation differs from the double sum (bound 1e-5 · Σ|w·x̂|).
TEST(MatMulTest, QuantisedMatchesQ8ActivationEmulation) {
  testing::ForEachTarget([&] {
    std::mt19937 rng(5);
    for (WeightType type : kAllTypes) {
      if (!IsQuantised(type)) continue;
      const int64_t rows = 9, n_tokens = 4;
      for (int64_t cols : ColsFor(type)) {
        auto w = MakeRandomWeights(rng, type, rows, cols);
        std::vector<float> x = RandomFloats(rng, n_tokens * cols);
        Q8Activations xq;
        QuantizeActivationsQ8(x.data(), n_tokens, cols, cols, &xq);
        std::vector<float> y(n_tokens * rows);
        MatMul(w.view, x.data(), n_tokens, y.data());
        std::vector<float> wrow(cols);
        for (int64_t r = 0; r < rows; ++r) {
          DequantizeRow(type, w.view.data + r * w.view.row_bytes, cols, wrow.data());
          for (int64_t t = 0; t < n_tokens; ++t) {
            double sum = 0, abs_sum = 0;
            for (int64_t k = 0; k < cols; ++k) {
              const double xhat =
                  static_cast<double>(xq.d[t * cols / 32 + k / 32]) * xq.qs[t * cols + k];
              sum += wrow[k] * xhat;
              abs_sum += std::fabs(wrow[k] * xhat);
            }
            ASSERT_NEAR(y[t * rows + r], sum, 1e-5 * abs_sum + 1e-30)
                << TraitsOf(type).name << " cols=" << cols << " r=" << r << " t=" << t;
          }
        }
      }
    }
  });
}

// q8 activations: d = amax/127, q = round-half-even(x/d), identical on every target.
TEST(MatMulTest, QuantizeActivationsQ8) {
  std::mt19937 rng(12);
  const int64_t cols = 96, n_tokens = 3;
  std::vector<float> x = RandomFloats(rng, n_tokens * cols);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 15.5f;  // ties after scaling
  x[5] = 127.0f;                                                      // d = 1
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;                          // all-zero block
  testing::ForEachTarget([&] {
    Q8Activations xq;
    QuantizeActivationsQ8(x.data(), n_tokens, cols, cols, &xq);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[t * cols + b * 32 + j]));
        const float d = amax / 127.0f;
        ASSERT_EQ(xq.d[t * 3 + b], d);
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
          const float v = x[t * cols + b * 32 + j];
          const int expected = d == 0 ? 0 : static_cast<int>(std::nearbyint(v * (1.0f / d)));
          ASSERT_EQ(xq.qs[t * cols + b * 32 + j], expected) << t << " " << b << " " << j;
          sum += expected;
        }
        ASSERT_EQ(xq.sum_d[t * 3 + b], d * static_cast<float>(sum));
      }
    }
    EXPECT_EQ(xq.qs[0], -16);  // -15.5 -> -16 (even)
    EXPECT_EQ(xq.qs[1], -14);  // -14.5 -> -14
  });
}

TEST(MatMulTest, RowShardComputesItsRows) {
  std::mt19937 rng(13);
  auto w = MakeRandomWeights(rng, WeightType::kQ4_0, 20, 64);
  std::vector<float> x = RandomFloats(rng, 3 * 64);
  std::vector<float> full(3 * 20), part(3 * 8);
  MatMul(w.view, x.data(), 3, full.data());
  MatMul(RowShard(w.view, 12, 20), x.data(), 3, part.data());
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t r = 0; r < 8; ++r) EXPECT_TRUE(BitEqual(part[t * 8 + r], full[t * 20 + 12 + r]));
}

TEST(MatMulTest, StridedInputAndOutput) {
  std::mt19937 rng(9);
  for (WeightType type : {WeightType::kF16, WeightType::kQ8_0}) {
    const int64_t rows = 6, cols = 64, n_tokens = 3, xs = 80, ys = 10;
    auto w = MakeRandomWeights(rng, type, rows, cols);
    std::vector<float> x = RandomFloats(rng, n_tokens * xs);
    std::vector<float> xd(n_tokens * cols);
    for (int64_t t = 0; t < n_tokens; ++t)
      std::copy(x.begin() + t * xs, x.begin() + t * xs + cols, xd.begin() + t * cols);
    std::vector<float> y(n_tokens * ys, -1.0f), yd(n_tokens * rows);
    MatMulOptions options;
    options.x_stride = xs;
    options.y_stride = ys;
    MatMul(w.view, x.data(), n_tokens, y.data(), options);
    MatMul(w.view, xd.data(), n_tokens, yd.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(BitEqual(y[t * ys + r], yd[t * rows + r]));
      for (int64_t r = rows; r < ys; ++r) EXPECT_EQ(y[t * ys + r], -1.0f);
    }
  }
}

// Batch invariance: a token's outputs are bit-identical whatever else is in the
// batch (GEMM == GEMV per token) and whatever the thread count.
TEST(MatMulTest, BatchAndThreadInvariantBitwise) {
  testing::ForEachTarget([&] {
    std::mt19937 rng(1);
    ThreadPool pool2(2), pool3(3);
    for (WeightType type : kAllTypes) {
      const int64_t cols = IsQuantised(type) ? 2048 : 200;
      const int64_t rows = 37, n_tokens = 29;  // > one 24-token block, with tails
      auto w = MakeRandomWeights(rng, type, rows, cols);
      std::vector<float> x = RandomFloats(rng, n_tokens * cols);
      std::vector<float> y1(n_tokens * rows), y2(n_tokens * rows), y3(n_tokens * rows);
      MatMul(w.view, x.data(), n_tokens, y1.data(), {}, nullptr);
      MatMul(w.view, x.data(), n_tokens, y2.data(), {}, &pool2);
      MatMul(w.view, x.data(), n_tokens, y3.data(), {}, &pool3);
      std::vector<float> single(rows);
      for (int64_t t = 0; t < n_tokens; ++t) {
        MatMul(w.view, x.data() + t * cols, 1, single.data(), {}, &pool2);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = t * rows + r;
          ASSERT_TRUE(BitEqual(y1[i], single[r]))
              << TraitsOf(type).name << " t=" << t << " r=" << r;
          ASSERT_TRUE(BitEqual(y1[i], y2[i])) << TraitsOf(type).name;
          ASSERT_TRUE(BitEqual(y1[i], y3[i])) << TraitsOf(type).name;
        }
      }
      // A sub-batch starting mid-tile gives the same bits too (7 tokens: K-quant tiles
      // of 4, 2 and 1).
      std::vector<float> sub(7 * rows);
      MatMul(w.view, x.data() + 4 * cols, 7, sub.data(), {}, &pool2);
      for (int64_t i = 0; i < 7 * rows; ++i) ASSERT_TRUE(BitEqual(sub[i], y1[4 * rows + i]));
    }
  });
}

// Products of one input run together (a layer's Q, K and V in one job) give each
// output MatMul's bits: mixed types and layouts, row counts that are not whole
// grains (so pieces of the job straddle two products), 1 and 3 tokens, 1-3 threads.
TEST(MatMulTest, SharedInputProductsGiveMatMulsBits) {
  std::mt19937 rng(31);
  ThreadPool pool2(2), pool3(3);
  const int64_t cols = 2048;
  struct Spec {
    WeightType type;
    int64_t rows;
    bool interleave;
  };
  const Spec specs[] = {{WeightType::kQ8_0, 264, true}, {WeightType::kQ4_K, 40, true},
                        {WeightType::kQ6_K, 24, true},  {WeightType::kF16, 72, true},
                        {WeightType::kQ4_0, 21, false}, {WeightType::kF32, 9, false}};
  std::vector<testing::RandomWeights> weights;
  std::vector<std::vector<uint8_t>> packed;
  std::vector<SharedProduct> products;
  for (const Spec& spec : specs) {
    weights.push_back(MakeRandomWeights(rng, spec.type, spec.rows, cols));
    WeightView view = weights.back().view;
    if (spec.interleave) {
      ASSERT_TRUE(CanInterleave8(view));
      packed.emplace_back(static_cast<size_t>(spec.rows * Interleaved8RowBytes(spec.type, cols)));
      view = Interleave8(view, packed.back().data());
    }
    products.push_back({.w = view});
  }
  for (int64_t n_tokens : {1, 3}) {
    std::vector<float> x = RandomFloats(rng, n_tokens * cols);
    std::vector<std::vector<float>> expected;
    for (const SharedProduct& p : products) {
      std::vector<float>& y = expected.emplace_back(n_tokens * p.w.rows);
      MatMul(p.w, x.data(), n_tokens, y.data());
    }
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
      std::vector<std::vector<float>> out;
      for (SharedProduct& p : products) p.y = out.emplace_back(n_tokens * p.w.rows, -1.0f).data();
      MatMulShared(products, x.data(), n_tokens, pool);
      for (size_t i = 0; i < products.size(); ++i) {
        for (size_t j = 0; j < out[i].size(); ++j) {
          ASSERT_TRUE(BitEqual(out[i][j], expected[i][j]))
              << TraitsOf(specs[i].type).name << " product " << i << " element " << j << ", "
              << n_tokens << " tokens, " << (pool ? pool->num_threads() : 1) << " threads";
        }
      }
    }
  }
}

// Q8_0 and Q4_0 sum exact integer block dots with one fma per block, Q4_K and Q6_K
// exact sub-block dots with two and one, so every SIMD target (and the row-group tiles of AVX2
// against the one-output scalar path of EMU128) gives the same bits, also for rows
// and tokens that do not fill a tile.
TEST(MatMulTest, BlockScaledTypesGiveTheSameBitsOnEveryTarget) {
  for (WeightType type :
       {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ6_K}) {
    std::mt19937 rng(17);
    const int64_t rows = 21, cols = 768, n_tokens = 7;
    auto w = MakeRandomWeights(rng, type, rows, cols);
    std::vector<float> x = RandomFloats(rng, n_tokens * cols);
    std::vector<std::vector<float>> results;
    testing::ForEachTarget([&] {
      std::vector<float> y(n_tokens * rows);
      MatMul(w.view, x.data(), n_tokens, y.data());
      results.push_back(std::move(y));
    });
    ASSERT_GE(results.size(), 2u) << "needs at least two SIMD targets";
    for (size_t target = 1; target < results.size(); ++target) {
      for (int64_t i = 0; i < n_tokens * rows; ++i) {
        ASSERT_TRUE(BitEqual(results[0][i], results[target][i]))
            << TraitsOf(type).name << " target #" << target << " output " << i << ": "
            << results[0][i] << " vs " << results[target][i];
      }
    }
  }
}

// Q8_0, Q4_0, Q4_K and Q6_K interleaved 8 rows to a group (kInterleaved8) give the bits of
// the GGUF row layout on every target, for every token count (tiles of 1-4, the
// prefetching batches up to 16, prefill), K-chunk count, thread count and row shard.
TEST(MatMulTest, InterleavedBlocksGiveTheBitsOfTheRowLayout) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (const auto& [type, rows, cols] :
       {std::tuple<WeightType, int64_t, int64_t>{WeightType::kQ8_0, 8, 32},
        {WeightType::kQ8_0, 40, 96},
        {WeightType::kQ8_0, 64, 2048},
        {WeightType::kQ4_0, 8, 32},
        {WeightType::kQ4_0, 40, 96},
        {WeightType::kQ4_0, 64, 2048},
        // 8192 columns: prefill batches (17, 33 tokens) take two or more token blocks
        {WeightType::kQ8_0, 16, 8192},
        {WeightType::kQ4_0, 16, 8192},
        {WeightType::kQ4_K, 8, 256},
        {WeightType::kQ4_K, 40, 768},
        {WeightType::kQ4_K, 64, 2048},
        {WeightType::kQ4_K, 16, 8192},
        {WeightType::kQ6_K, 8, 256},
        {WeightType::kQ6_K, 40, 768},
        {WeightType::kQ6_K, 64, 2048},
        {WeightType::kQ6_K, 16, 8192}}) {
    SCOPED_TRACE(TraitsOf(type).name);
    auto w = MakeRandomWeights(rng, type, rows, cols);
    ASSERT_TRUE(CanInterleave8(w.view));
    std::vector<uint8_t> packed(static_cast<size_t>(rows * Interleaved8RowBytes(type, cols)));
    const WeightView x8 = Interleave8(w.view, packed.data());
    EXPECT_EQ(x8.layout, WeightLayout::kInterleaved8);
    const int64_t granularity = KChunkGranularity(type);
    for (int64_t n_tokens : {1, 2, 3, 4, 5, 9, 17, 33}) {
      std::vector<float> x = RandomFloats(rng, n_tokens * cols);
      for (int k_chunks : {1, static_cast<int>(std::min<int64_t>(cols / granularity, 64))}) {
        std::vector<float> want(n_tokens * rows);
        MatMul(w.view, x.data(), n_tokens, want.data(), {.k_chunks = k_chunks}, &pool);
        testing::ForEachTarget([&] {
          std::vector<float> got(n_tokens * rows, -1.0f);
          MatMul(x8, x.data(), n_tokens, got.data(), {.k_chunks = k_chunks}, &pool);
          for (int64_t i = 0; i < n_tokens * rows; ++i) {
            ASSERT_TRUE(BitEqual(got[i], want[i]))
                << rows << "x" << cols << ", " << n_tokens << " tokens, " << k_chunks
                << " chunks: output " << i << " " << got[i] << " vs " << want[i];
          }
        });
      }
    }
    if (cols >= 2 * granularity) {  // a column shard (rows a whole matrix apart) interleaves too
      const WeightView shard = ColumnShard(w.view, granularity, cols);
      const int64_t shard_cols = cols - granularity;
      std::vector<uint8_t> shard_packed(
          static_cast<size_t>(rows * Interleaved8RowBytes(type, shard_cols)));
      const WeightView shard_x8 = Interleave8(shard, shard_packed.data());
      std::vector<float> x = RandomFloats(rng, 5 * shard_cols);
      std::vector<float> want(5 * rows), got(5 * rows);
      MatMul(shard, x.data(), 5, want.data());
      MatMul(shard_x8, x.data(), 5, got.data());
      for (int64_t i = 0; i < 5 * rows; ++i) ASSERT_TRUE(BitEqual(got[i], want[i])) << i;
    }
    if (rows >= 16) {  // a row shard on a group boundary reads its own groups
      const WeightView half = RowShard(x8, 8, rows);
      std::vector<float> x = RandomFloats(rng, 3 * cols);
      std::vector<float> want(3 * rows), got(3 * (rows - 8));
      MatMul(w.view, x.data(), 3, want.data());
      MatMul(half, x.data(), 3, got.data());
      for (int64_t t = 0; t < 3; ++t) {
        for (int64_t r = 8; r < rows; ++r) {
          ASSERT_TRUE(BitEqual(got[t * (rows - 8) + r - 8], want[t * rows + r]));
        }
      }
    }
  }
  auto odd = MakeRandomWeights(rng, WeightType::kQ4_0, 12, 64);
  EXPECT_FALSE(CanInterleave8(odd.view));  // not a multiple of 8 rows
  auto odd_q6k = MakeRandomWeights(rng, WeightType::kQ6_K, 20, 256);
  EXPECT_FALSE(CanInterleave8(odd_q6k.view));
}

// A K-quant's contract written out: `chunk(row, xq, t, b_begin, b_end)` is one
// output's K-chunk partial over super-blocks [b_begin, b_end) of the GGUF row, in
// scalar code; the chunk tree combines them. Every target, both layouts (the GGUF
// rows and their interleaving), GEMV and a batch with tails, 1 and 2 threads and 1, 2
// and 8 chunks must give exactly these bits. Rows 8-15 get `extreme` applied to each
// super-block, against a first token of all ones (q8 127 everywhere).
template <class ExtremeFn, class ChunkFn>
void CheckKQuantContract(WeightType type, int seed, ExtremeFn&& extreme, ChunkFn&& chunk) {
  std::mt19937 rng(seed);
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 2048, super_bytes = TraitsOf(type).block_bytes;
  auto w = MakeRandomWeights(rng, type, rows, cols);
  for (int64_t r = 8; r < 16; ++r) {
    for (int64_t b = 0; b < cols / 256; ++b) {
      extreme(w.bytes.data() + r * w.view.row_bytes + b * super_bytes, r);
    }
  }
  std::vector<uint8_t> packed(static_cast<size_t>(rows * Interleaved8RowBytes(type, cols)));
  const WeightView x8 = Interleave8(w.view, packed.data());
  for (int64_t n_tokens : {1, 6}) {
    std::vector<float> x = RandomFloats(rng, n_tokens * cols);
    std::fill(x.begin(), x.begin() + cols, 1.0f);
    Q8Activations xq;
    QuantizeActivationsQ8(x.data(), n_tokens, cols, cols, &xq);
    for (int k_chunks : {1, 2, 8}) {
      std::vector<float> want(n_tokens * rows);
      const int64_t supers_per_chunk = cols / 256 / k_chunks;
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> partial(k_chunks);
          for (int c = 0; c < k_chunks; ++c) {
            partial[c] = chunk(w.view.data + r * w.view.row_bytes, xq, t, c * supers_per_chunk,
                               (c + 1) * supers_per_chunk);
          }
          want[t * rows + r] = KChunkTreeSum(partial.data(), 0, k_chunks);
        }
      }
      testing::ForEachTarget([&] {
        for (const WeightView& view : {w.view, x8}) {
          for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> got(n_tokens * rows);
            MatMul(view, x.data(), n_tokens, got.data(), {.k_chunks = k_chunks}, threads);
            for (int64_t i = 0; i < n_tokens * rows; ++i) {
              ASSERT_TRUE(BitEqual(got[i], want[i]))
                  << (view.layout == WeightLayout::kRows ? "rows" : "interleaved") << ", "
                  << n_tokens << " tokens, " << k_chunks << " chunks: output " << i << " " << got[i]
                  << " vs " << want[i];
            }
          }
        }
      });
    }
  }
}

float F16At(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// Q4_K: per 32-element sub-block in order, acc = fma(S, (d·sc)·d_x, acc) and
// macc = fma(dmin·m, d_x·Σx, macc) from 0, the partial acc − macc (matmul.h). The
// extreme rows have every nibble 15: the largest int16 sums the AVX2 tile adds up
// before widening (8 · 2 · 15 · 127).
TEST(MatMulTest, Q4KFollowsItsContractOnEveryTarget) {
  CheckKQuantContract(
      WeightType::kQ4_K, 31,
      [](uint8_t* sb, int64_t) { std::memset(sb + kQ4KQsOffset, 0xFF, 128); },
      [](const uint8_t* row, const Q8Activations& xq, int64_t t, int64_t b0, int64_t b1) {
        const int64_t cols = xq.cols;
        float acc = 0.0f, macc = 0.0f;
        for (int64_t b = b0; b < b1; ++b) {
          const uint8_t* sb = row + b * 144;
          const float d = F16At(sb), dmin = F16At(sb + 2);
          for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            Q4KScaleMin(s, sb + kQ4KScalesOffset, &sc, &m);
            const int64_t j = b * 8 + s;  // the q8 block
            int32_t dot = 0;
            for (int e = 0; e < 32; ++e) {
              const uint8_t byte = sb[kQ4KQsOffset + 32 * (s / 2) + e];
              dot += ((s % 2 == 0) ? byte & 0xF : byte >> 4) * xq.qs[t * cols + j * 32 + e];
            }
            const float dx = xq.d[t * cols / 32 + j];
            acc = std::fma(static_cast<float>(dot), (d * static_cast<float>(sc)) * dx, acc);
            macc = std::fma(dmin * static_cast<float>(m), xq.sum_d[t * cols / 32 + j], macc);
          }
        }
        return acc - macc;
      });
}

// Q6_K: per 32-element sub-block in order, S = sc_a·Σ(q − 32)·x + sc_b·Σ(q − 32)·x
// over its halves of 16 (exact) and acc = fma(S, d·d_x, acc) from 0 (matmul.h). The
// extreme rows have every quant 63 (+31) and scales of ±127: the largest |S|.
TEST(MatMulTest, Q6KFollowsItsContractOnEveryTarget) {
  CheckKQuantContract(
      WeightType::kQ6_K, 37,
      [](uint8_t* sb, int64_t r) {
        std::memset(sb, 0xFF, kQ6KScalesOffset);
        for (int g = 0; g < 16; ++g) sb[kQ6KScalesOffset + g] = (g + r) % 2 ? 0x7F : 0x81;
      },
      [](const uint8_t* row, const Q8Activations& xq, int64_t t, int64_t b0, int64_t b1) {
        const int64_t cols = xq.cols;
        float acc = 0.0f;
        for (int64_t b = b0; b < b1; ++b) {
          const uint8_t* sb = row + b * 210;
          const float d = F16At(sb + kQ6KDOffset);
          for (int s = 0; s < 8; ++s) {
            const int64_t j = b * 8 + s;  // the q8 block
            int32_t sum = 0;
            for (int h = 0; h < 2; ++h) {
              int32_t half = 0;
              for (int e = 32 * s + 16 * h; e < 32 * s + 16 * h + 16; ++e) {
                // ggml's order: within each 128 of the super-block, elements l, l + 32,
                // l + 64, l + 96 share qh[l] (2 bits each) and ql[l] / ql[l + 32].
                const int n = e / 128, l = e % 32, quarter = (e % 128) / 32;
                const uint8_t ql = sb[64 * n + 32 * (quarter % 2) + l];
                const uint8_t qh = sb[kQ6KQhOffset + 32 * n + l];
                const int q =
                    ((quarter >= 2 ? ql >> 4 : ql) & 0xF) | (((qh >> (2 * quarter)) & 3) << 4);
                half += (q - 32) * xq.qs[t * cols + b * 256 + e];
              }
              sum += static_cast<int8_t>(sb[kQ6KScalesOffset + 2 * s + h]) * half;
            }
            acc = std::fma(static_cast<float>(sum), d * xq.d[t * cols / 32 + j], acc);
          }
        }
        return acc;
      });
}

// GgufRow reads any row of an interleaved matrix back into the GGUF layout, byte for
// byte (the embedding lookup of a tied head), and copies a kRows row as it is.
TEST(MatMulTest, GgufRowReadsInterleavedRowsBack) {
  std::mt19937 rng(41);
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0,
                          WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ6_K}) {
    SCOPED_TRACE(TraitsOf(type).name);
    const int64_t rows = 24, cols = 512;
    auto w = MakeRandomWeights(rng, type, rows, cols);
    std::vector<uint8_t> packed(static_cast<size_t>(rows * Interleaved8RowBytes(type, cols)));
    const WeightView x8 = Interleave8(w.view, packed.data());
    const int64_t row_bytes = *RowBytes(type, cols);
    std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      for (const WeightView& view : {w.view, x8}) {
        std::fill(row.begin(), row.end(), 0xA5);
        GgufRow(view, r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), w.view.data + r * w.view.row_bytes, row_bytes), 0)
            << "row " << r << (view.layout == WeightLayout::kRows ? " (rows)" : " (interleaved)");
      }
    }
  }
}

// The float contract written out: per output and K chunk, one fma chain in k order
// from 0, then the chunk tree. Every target, both layouts (kRows packs its rows on the
// fly, with a zero-padded tail group), GEMV and batches with token tails, 1 and 2
// threads, canonical and odd chunk counts must give exactly these bits.
TEST(MatMulTest, FloatTypesChainEachChunkInKOrder) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    SCOPED_TRACE(TraitsOf(type).name);
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 96}, {80, 7}, {8, 1000}}) {
      auto w = MakeRandomWeights(rng, type, rows, cols);
      std::vector<uint8_t> packed;
      std::vector<WeightView> views = {w.view};
      if (rows % 8 == 0) {
        ASSERT_TRUE(CanInterleave8(w.view));
        packed.resize(static_cast<size_t>(rows * w.view.row_bytes));
        views.push_back(Interleave8(w.view, packed.data()));
      }
      std::vector<float> wrow(cols);
      for (int k_chunks : {1, CanonicalKChunks(type, cols), cols % 3 == 0 ? 3 : 1}) {
        // 260: a prefill batch, which widens F16/BF16 blocks to f32 first (AVX-512).
        for (int64_t n_tokens : {1, 3, 4, 9, 260}) {
          std::vector<float> x = RandomFloats(rng, n_tokens * cols);
          std::vector<float> want(n_tokens * rows);
          const int64_t chunk = cols / k_chunks;
          for (int64_t r = 0; r < rows; ++r) {
            DequantizeRow(type, w.view.data + r * w.view.row_bytes, cols, wrow.data());
            for (int64_t t = 0; t < n_tokens; ++t) {
              float partial[64];
              for (int c = 0; c < k_chunks; ++c) {
                float acc = 0.0f;
                for (int64_t k = c * chunk; k < (c + 1) * chunk; ++k) {
                  acc = std::fma(wrow[k], x[t * cols + k], acc);
                }
                partial[c] = acc;
              }
              want[t * rows + r] = KChunkTreeSum(partial, 0, k_chunks);
            }
          }
          for (const WeightView& view : views) {
            testing::ForEachTarget([&] {
              for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
                std::vector<float> got(n_tokens * rows, -1.0f);
                MatMul(view, x.data(), n_tokens, got.data(), {.k_chunks = k_chunks}, p);
                for (int64_t i = 0; i < n_tokens * rows; ++i) {
                  ASSERT_TRUE(BitEqual(got[i], want[i]))
                      << rows << "x" << cols
                      << (view.layout == WeightLayout::kRows ? " rows" : " x8") << ", " << n_tokens
                      << " tokens, " << k_chunks << " chunks: output " << i << " " << got[i]
                      << " vs " << want[i];
                }
              }
            });
          }
        }
      }
    }
  }
}

// The integer sums at their extremes, which quantised random weights never reach:
// Q8_0 quants of -128 and 127, Q4_0 nibbles of 15 and 0, against activations that
// quantise to ±127 (every x = ±1). The interleaved kernel must give the row layout's
// bits, and both the exact value (each block dot is an exact integer).
TEST(MatMulTest, InterleavedBlocksAreExactAtTheExtremes) {
  constexpr int64_t kRows = 16, kCols = 256, kTokens = 5;
  for (WeightType type : {WeightType::kQ8_0, WeightType::kQ4_0}) {
    SCOPED_TRACE(TraitsOf(type).name);
    const int64_t block_bytes = TraitsOf(type).block_bytes, row_bytes = kCols / 32 * block_bytes;
    std::vector<uint8_t> bytes(kRows * row_bytes);
    std::vector<double> w(kRows * kCols);  // the dequantised weights, exactly
    const uint16_t one = F32ToF16(1.0f);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t j = 0; j < kCols / 32; ++j) {
        uint8_t* block = bytes.data() + r * row_bytes + j * block_bytes;
        std::memcpy(block, &one, 2);
        const bool low = (r + j) % 2 == 0;  // alternate the extremes by row and block
        for (int64_t e = 0; e < 32; ++e) {
          double v;
          if (type == WeightType::kQ8_0) {
            block[2 + e] = low ? 0x80 : 0x7F;  // -128 / 127
            v = low ? -128 : 127;
          } else {
            if (e < 16) block[2 + e] = low ? 0x00 : 0xFF;  // nibbles 0 / 15
            v = low ? -8 : 7;
          }
          w[r * kCols + j * 32 + e] = v;
        }
      }
    }
    const WeightView rows_view{type, bytes.data(), kRows, kCols, row_bytes};
    std::vector<uint8_t> packed(bytes.size());
    const WeightView x8 = Interleave8(rows_view, packed.data());
    std::vector<float> x(kTokens * kCols);
    for (int64_t i = 0; i < kTokens * kCols; ++i) x[i] = (i / 7) % 2 == 0 ? 1.0f : -1.0f;
    std::vector<float> want(kTokens * kRows), got(kTokens * kRows);
    MatMul(rows_view, x.data(), kTokens, want.data());
    testing::ForEachTarget([&] {
      MatMul(x8, x.data(), kTokens, got.data());
      for (int64_t t = 0; t < kTokens; ++t) {
        for (int64_t r = 0; r < kRows; ++r) {
          double exact = 0;  // q8 of ±1 is ±127 with d = 1/127: x itself
          for (int64_t k = 0; k < kCols; ++k) exact += w[r * kCols + k] * x[t * kCols + k];
          const float y = got[t * kRows + r];
          ASSERT_TRUE(BitEqual(y, want[t * kRows + r])) << t << "," << r << ": " << y;
          EXPECT_NEAR(y, exact, 1e-5 * std::fabs(exact) + 1e-3) << t << "," << r;
        }
      }
    });
  }
}

// The K-chunk tree across column shards, as tensor parallelism will use it:
// full MatMul == Tree over the shards' MatMul results, bitwise, for 2 and 4 shards.
TEST(MatMulTest, ColumnShardsCombineBitwise) {
  testing::ForEachTarget([&] {
    std::mt19937 rng(11);
    for (WeightType type : kAllTypes) {
      const int64_t g = KChunkGranularity(type);
      const int64_t cols = 8 * g * (g == 1 ? 25 : 1) * (g == 32 ? 3 : 1);
      ASSERT_EQ(CanonicalKChunks(type, cols), 8) << TraitsOf(type).name;
      const int64_t rows = 13, n_tokens = 5;
      auto w = MakeRandomWeights(rng, type, rows, cols);
      std::vector<float> x = RandomFloats(rng, n_tokens * cols);
      std::vector<float> full(n_tokens * rows);
      MatMul(w.view, x.data(), n_tokens, full.data());
      for (int shards : {2, 4}) {
        const int64_t shard_cols = cols / shards;
        std::vector<std::vector<float>> part(shards, std::vector<float>(n_tokens * rows));
        for (int s = 0; s < shards; ++s) {
          const WeightView shard = ColumnShard(w.view, s * shard_cols, (s + 1) * shard_cols);
          MatMulOptions options;
          options.k_chunks = 8 / shards;
          options.x_stride = cols;
          MatMul(shard, x.data() + s * shard_cols, n_tokens, part[s].data(), options);
        }
        for (int64_t i = 0; i < n_tokens * rows; ++i) {
          std::vector<float> c(shards);
          for (int s = 0; s < shards; ++s) c[s] = part[s][i];
          ASSERT_TRUE(BitEqual(full[i], KChunkTreeSum(c.data(), 0, shards)))
              << TraitsOf(type).name << " shards=" << shards << " i=" << i;
        }
      }
    }
  });
}

// MatMulPrefetcher only hints the cache, so what can be checked is how much it
// walks: the budget when the matrix is larger (split over the threads' shares),
// the whole matrix when it is smaller, nothing when there is nothing to read.
int PrefetchSteps(const WeightView& w, int64_t n_tokens, const ThreadPool* pool, int64_t budget,
                  int64_t step) {
  MatMulPrefetcher prefetch(w, n_tokens, pool, budget);
  int steps = 1;
  while (prefetch.Step(step)) {
    ++steps;
    if (steps > 1'000'000) break;
  }
  return steps;
}

TEST(MatMulTest, PrefetcherWalksItsBudgetOrTheWholeMatrix) {
  for (WeightType type : {WeightType::kQ8_0, WeightType::kF16}) {
    const int64_t rows = 256, cols = 512;
    const int64_t row_bytes = *RowBytes(type, cols);
    std::vector<uint8_t> data(static_cast<size_t>(rows * row_bytes), 1);
    WeightView w{type, data.data(), rows, cols, row_bytes, WeightLayout::kRows};
    std::vector<uint8_t> packed(data.size());
    const WeightView interleaved = Interleave8(w, packed.data());
    const int64_t bytes = rows * row_bytes;
    ThreadPool pool(2);
    for (const auto& [v, layout] : {std::pair{w, "rows"}, std::pair{interleaved, "interleaved"}}) {
      SCOPED_TRACE(std::string(TraitsOf(type).name) + " " + layout);
      // Budget below the matrix: budget / step steps, with one thread or two.
      EXPECT_EQ(PrefetchSteps(v, 1, nullptr, bytes / 2, 1024), bytes / 2 / 1024);
      EXPECT_EQ(PrefetchSteps(v, 1, &pool, bytes / 2, 1024), bytes / 2 / 1024);
      // Budget above it: every byte once, then done.
      EXPECT_EQ(PrefetchSteps(v, 1, &pool, bytes * 4, 1024), bytes / 1024);
      EXPECT_EQ(PrefetchSteps(v, 1, nullptr, 0, 1024), 1);
    }
    // A column shard (rows farther apart than what is read): each row's read part.
    const WeightView shard = ColumnShard(w, 0, cols / 2);
    EXPECT_EQ(PrefetchSteps(shard, 1, nullptr, bytes * 4, 1024), bytes / 2 / 1024);
  }
}

}  // namespace
}  // namespace tessera::kernels
