#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "base/half.h"
#include "base/thread_pool.h"
#include "kernels/reference/reference.h"
#include "test_util.h"

namespace tessera::kernels {
namespace {

using testing::BitEqual;
using testing::ForEachTarget;
using testing::RandomFloats;

// A pool of n_blocks blocks holding one sequence of `len` tokens under a shuffled
// block table, filled through StoreKv.
struct TestCache {
  KvLayout layout;
  std::vector<uint8_t> k, v;
  std::vector<int32_t> table;
  PagedKv view;
};

TestCache MakeCache(std::mt19937& rng, KvType type, int64_t head_dim, int64_t len,
                    int64_t n_kv_heads = 2, int64_t span = kAttentionSpan) {
  TestCache c;
  c.layout = KvLayout{4, n_kv_heads, head_dim, type};
  c.layout.span = span;
  // Blocks further apart than their size, as in a KV cache whose blocks hold every
  // layer (kv/), with garbage between them (0x7f bytes: NaN as f16, 3.4e38 as f32),
  // which a kernel ignoring the stride would read.
  c.layout.block_stride = c.layout.BlockElems() + 24;
  const int64_t n_blocks = (len + 3) / 4 + 3;
  c.k.resize(n_blocks * c.layout.BlockStride() * c.layout.ElemBytes(), 0x7f);
  c.v.resize(n_blocks * c.layout.BlockStride() * c.layout.ElemBytes(), 0x7f);
  std::vector<int32_t> physical(n_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  c.table.assign(physical.begin(), physical.begin() + (len + 3) / 4);
  for (int64_t p = 0; p < len; ++p) {
    auto k = RandomFloats(rng, c.layout.TokenElems()), v = RandomFloats(rng, c.layout.TokenElems());
    StoreKv(c.layout, c.table, p, k.data(), v.data(), c.k.data(), c.v.data());
  }
  c.view = PagedKv{c.layout, c.k.data(), c.v.data(), n_blocks};
  return c;
}

TEST(AttentionTest, StoreKvFollowsLayoutContract) {
  KvLayout layout{4, 2, 3, KvType::kF16};
  std::vector<uint16_t> k(3 * layout.BlockElems(), 0), v(3 * layout.BlockElems(), 0);
  const std::vector<int32_t> table = {2, 0};
  const std::vector<float> kt = {1, 2, 3, 4, 5, 6}, vt = {-1, -2, -3, -4, -5, -6};
  StoreKv(layout, table, 5, kt.data(), vt.data(), k.data(), v.data());  // block 0, slot 1
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 3; ++d) {
      const int64_t index = ((0 * 2 + h) * 4 + 1) * 3 + d;  // head-major block 0
      EXPECT_EQ(F16ToF32(k[index]), kt[h * 3 + d]);
      EXPECT_EQ(F16ToF32(v[index]), vt[h * 3 + d]);
    }
  }
  EXPECT_EQ(std::count(k.begin(), k.end(), 0), static_cast<long>(k.size() - 6));
}

// An f16 cache stores F32ToF16's bits (base/half.h's row conversion) in the layout's
// places: a row whose length is no multiple of 8, with ties, f16 subnormals, values
// that round to infinity, infinities and the default NaN among random magnitudes.
TEST(AttentionTest, StoreKvF16GivesTheScalarConversionsBits) {
  constexpr int64_t kDim = 1003;
  std::mt19937 rng(11);
  std::vector<float> k_row(kDim), v_row(kDim);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 18);
  for (float& x : k_row) x = std::ldexp(mantissa(rng), exponent(rng));
  for (float& x : v_row) x = std::ldexp(mantissa(rng), exponent(rng));
  const float specials[] = {1.0f + 1.0f / 2048,  // a tie: rounds to even
                            1.0f + 3.0f / 2048,
                            6.0e-8f,
                            -3.0e-6f,
                            65519.0f,
                            65520.0f,
                            -1.0e9f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -0.0f};
  std::copy(std::begin(specials), std::end(specials), k_row.begin() + 500);
  // Two heads of kDim, block size 2, position 3 (block table {1, 0}: physical block 0,
  // slot 1), in pools of two blocks.
  const KvLayout layout{2, 2, kDim, KvType::kF16};
  const std::vector<int32_t> table = {1, 0};
  std::vector<float> k(2 * kDim), v(2 * kDim);
  std::copy(k_row.begin(), k_row.end(), k.begin());
  std::copy(v_row.begin(), v_row.end(), k.begin() + kDim);
  std::copy(v_row.begin(), v_row.end(), v.begin());
  std::copy(k_row.begin(), k_row.end(), v.begin() + kDim);
  std::vector<uint16_t> k_pool(2 * layout.BlockElems()), v_pool(k_pool.size());
  StoreKv(layout, table, 3, k.data(), v.data(), k_pool.data(), v_pool.data());
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t row = layout.RowIndex(0, 1, h);
    for (int64_t i = 0; i < kDim; ++i) {
      ASSERT_EQ(k_pool[row + i], F32ToF16(k[h * kDim + i])) << h << " " << i;
      ASSERT_EQ(v_pool[row + i], F32ToF16(v[h * kDim + i])) << h << " " << i;
    }
  }
}

// Context parallelism's K/V exchange: rows converted head by head on the rank that
// computed them and stored as f16 elsewhere fill the pool with StoreKv's bytes.
TEST(AttentionTest, RowsConvertedBeforehandStoreStoreKvsBytes) {
  const KvLayout layout{4, 3, 5, KvType::kF16};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-70000.0f, 70000.0f);
  const std::vector<int32_t> table = {2, 0, 1};
  std::vector<uint16_t> expect_k(3 * layout.BlockElems()), expect_v(expect_k.size());
  std::vector<uint16_t> got_k(expect_k.size()), got_v(expect_k.size());
  for (int64_t pos = 0; pos < 12; ++pos) {
    std::vector<float> k(15), v(15);
    for (float& x : k) x = value(rng) / (1 + pos * pos);
    for (float& x : v) x = value(rng) / (1 + pos);
    StoreKv(layout, table, pos, k.data(), v.data(), expect_k.data(), expect_v.data());
    std::vector<uint16_t> k16(15), v16(15);
    for (int64_t h = 0; h < 3; ++h) {
      KvHeadToF16(k.data() + h * 5, k16.data() + h * 5, 5);
      KvHeadToF16(v.data() + h * 5, v16.data() + h * 5, 5);
    }
    StoreKvF16(layout, table, pos, k16.data(), v16.data(), got_k.data(), got_v.data());
  }
  EXPECT_EQ(got_k, expect_k);
  EXPECT_EQ(got_v, expect_v);
}

// Outputs are convex combinations of V rows (|v| ~ 1): the f32 dot, exp and
// accumulation errors stay below 2e-5 absolute for these lengths, whether the
// softmax is one span or folded from spans of 8 or 5 positions.
TEST(AttentionTest, MatchesReference) {
  std::mt19937 rng(8);
  ForEachTarget([&] {
    for (auto [type, span] : {std::pair<KvType, int64_t>{KvType::kF32, kAttentionSpan},
                              {KvType::kF16, kAttentionSpan},
                              {KvType::kF32, 8},
                              {KvType::kF16, 5}}) {
      for (auto [head_dim, n_heads] : {std::pair<int64_t, int64_t>{16, 6},
                                       {20, 6},
                                       {64, 6},
                                       {64, 18},
                                       {32, 2}}) {  // groups of 3, 9, 1
        const int64_t len = 37;
        TestCache c = MakeCache(rng, type, head_dim, len, 2, span);
        for (int64_t pos : {0, 3, 4, 13, 36}) {
          auto q = RandomFloats(rng, n_heads * head_dim);
          std::vector<float> out(n_heads * head_dim), ref(n_heads * head_dim);
          Attention(c.view, c.table, q.data(), n_heads, pos, out.data());
          reference::Attention(c.view, c.table, q.data(), n_heads, pos, ref.data());
          for (size_t i = 0; i < out.size(); ++i) {
            ASSERT_NEAR(out[i], ref[i], 2e-5)
                << "head_dim " << head_dim << " pos " << pos << " span " << span;
          }
        }
      }
    }
  });
}

// Chunk/batch invariance: every query of a multi-query call equals the single-query
// call bitwise, for any chunking and thread count, with one span or many (a tile's
// queries then see different numbers of spans).
TEST(AttentionTest, MultiQueryEqualsSingleBitwise) {
  std::mt19937 rng(9);
  ThreadPool pool(2);
  ForEachTarget([&] {
    for (auto [type, head_dim, n_heads, span] :
         {std::tuple<KvType, int64_t, int64_t, int64_t>{KvType::kF32, 20, 4, kAttentionSpan},
          {KvType::kF16, 20, 4, 8},
          {KvType::kF32, 64, 18, kAttentionSpan},
          {KvType::kF16, 64, 16, 6},
          {KvType::kF16, 64, 2, 8},  // no grouped heads: decode takes heads in pairs
          {KvType::kF32, 64, 2, kAttentionSpan},
          {KvType::kF32, 128, 2, 12}}) {
      const int64_t len = 41;
      TestCache c = MakeCache(rng, type, head_dim, len, 2, span);
      const int64_t pos0 = 5, n_queries = len - pos0;
      auto q = RandomFloats(rng, n_queries * n_heads * head_dim);
      const int64_t row = n_heads * head_dim;
      std::vector<float> multi(n_queries * row), multi_pool(n_queries * row);
      AttentionMulti(c.view, c.table, q.data(), n_heads, pos0, n_queries, multi.data());
      AttentionMulti(c.view, c.table, q.data(), n_heads, pos0, n_queries, multi_pool.data(), &pool);
      std::vector<float> chunked(n_queries * row);  // chunks of 7
      for (int64_t b = 0; b < n_queries; b += 7) {
        const int64_t n = std::min<int64_t>(7, n_queries - b);
        AttentionMulti(c.view, c.table, q.data() + b * row, n_heads, pos0 + b, n,
                       chunked.data() + b * row, &pool);
      }
      for (int64_t qi = 0; qi < n_queries; ++qi) {
        std::vector<float> single(row), single_pool(row);
        Attention(c.view, c.table, q.data() + qi * row, n_heads, pos0 + qi, single.data());
        Attention(c.view, c.table, q.data() + qi * row, n_heads, pos0 + qi, single_pool.data(),
                  &pool);
        for (int64_t i = 0; i < row; ++i) {
          ASSERT_TRUE(BitEqual(single[i], single_pool[i])) << qi << " " << i << " span " << span;
          ASSERT_TRUE(BitEqual(single[i], multi[qi * row + i])) << qi << " " << i;
          ASSERT_TRUE(BitEqual(single[i], multi_pool[qi * row + i])) << qi << " " << i;
          ASSERT_TRUE(BitEqual(single[i], chunked[qi * row + i])) << qi << " " << i;
        }
      }
    }
  });
}

// Decode without grouped heads splits the KV heads into one run per thread, which a
// target may take two at a time: runs of odd length (5 heads over 1, 2 and 3
// threads: 5; 3 + 2; 2 + 2 + 1) give the bits of the prefill path.
TEST(AttentionTest, LoneHeadsInRunsOfAnyLengthGiveThePrefillBits) {
  std::mt19937 rng(11);
  ThreadPool pool2(2), pool3(3);
  ForEachTarget([&] {
    for (int64_t span : {kAttentionSpan, int64_t{8}}) {
      const int64_t head_dim = 64, n_heads = 5, len = 29;
      TestCache c = MakeCache(rng, KvType::kF16, head_dim, len, n_heads, span);
      const int64_t row = n_heads * head_dim;
      auto q = RandomFloats(rng, 2 * row);
      std::vector<float> prefill(2 * row);  // the last two positions: the multi-query path
      AttentionMulti(c.view, c.table, q.data(), n_heads, len - 2, 2, prefill.data());
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
        std::vector<float> decode(row);
        Attention(c.view, c.table, q.data() + row, n_heads, len - 1, decode.data(), pool);
        for (int64_t i = 0; i < row; ++i) {
          ASSERT_TRUE(BitEqual(decode[i], prefill[row + i]))
              << "element " << i << ", " << (pool ? pool->num_threads() : 1) << " threads";
        }
      }
    }
  });
}

// The x86 targets from AVX2 up share one contract (8-lane dots and the same lane
// tree, 8-lane softmax sums, each output element's FMA chain in position order):
// the AVX-512 code pairs rows in 16-lane registers yet gives AVX2's bits, so a
// model's logits do not depend on which of these hosts computed them.
TEST(AttentionTest, X86TargetsFromAvx2UpGiveTheSameBits) {
  std::vector<int64_t> targets;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (HWY_ARCH_X86 && target <= HWY_AVX2) targets.push_back(target);  // AVX2, AVX3*
  }
  if (targets.size() < 2) GTEST_SKIP() << "fewer than two x86 targets from AVX2 up here";
  std::mt19937 rng(10);
  for (auto [type, head_dim, n_heads, span] :
       {std::tuple<KvType, int64_t, int64_t, int64_t>{KvType::kF16, 64, 16, kAttentionSpan},
        {KvType::kF32, 64, 18, 8},
        {KvType::kF16, 128, 4, kAttentionSpan},
        {KvType::kF32, 32, 6, 8},
        {KvType::kF16, 64, 2, 8},
        {KvType::kF32, 128, 2, kAttentionSpan}}) {
    const int64_t len = 53;
    TestCache c = MakeCache(rng, type, head_dim, len, 2, span);
    const int64_t pos0 = 9, n_queries = len - pos0, row = n_heads * head_dim;
    auto q = RandomFloats(rng, n_queries * row);
    std::vector<float> first;
    for (int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> out(n_queries * row);
      AttentionMulti(c.view, c.table, q.data(), n_heads, pos0, n_queries, out.data());
      std::vector<float> decode(row);  // the last query alone
      Attention(c.view, c.table, q.data() + (n_queries - 1) * row, n_heads, len - 1, decode.data());
      out.insert(out.end(), decode.begin(), decode.end());
      if (first.empty()) {
        first = std::move(out);
        continue;
      }
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_TRUE(BitEqual(first[i], out[i]))
            << hwy::TargetName(target) << " vs " << hwy::TargetName(targets[0]) << ", head_dim "
            << head_dim << ", heads " << n_heads << ", element " << i;
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

// Context parallelism's contract: ranks holding different spans of a sequence compute
// their spans' partials alone (block-table entries of the other spans are poisoned:
// never read), and folding all of them in span order gives Attention's bits, on every
// target, grouped heads or not, f32 or f16, for a query on a span boundary or inside
// the last span.
TEST(AttentionTest, SpanPartialsFromDisjointHoldersFoldToAttentionsBits) {
  std::mt19937 rng(12);
  ThreadPool pool(2);
  ForEachTarget([&] {
    for (auto [type, head_dim, n_heads] :
         {std::tuple<KvType, int64_t, int64_t>{KvType::kF32, 64, 2},  // MHA: decode in head pairs
          {KvType::kF16, 64, 6},
          {KvType::kF16, 20, 4},  // the portable path
          {KvType::kF32, 32, 2}}) {
      const int64_t span = 8, len = 53;
      TestCache c = MakeCache(rng, type, head_dim, len, 2, span);
      for (int64_t pos : {int64_t{15}, int64_t{40}, len - 1}) {
        const int64_t n_spans = pos / span + 1, row = n_heads * head_dim;
        auto q = RandomFloats(rng, row);
        std::vector<float> out(n_spans * row), max(n_spans * n_heads), sum(n_spans * n_heads);
        // Holders: span 0 alone, then runs of two spans, each from its own first span on.
        for (int64_t first = 0; first < n_spans; first += first == 0 ? 1 : 2) {
          const int64_t count = std::min<int64_t>(first == 0 ? 1 : 2, n_spans - first);
          std::vector<int32_t> table = c.table;
          for (int64_t b = 0; b < first * span / 4; ++b) table[b] = -1;
          SpanPartials part{first,
                            count,
                            n_heads,
                            out.data() + first * row,
                            max.data() + first * n_heads,
                            sum.data() + first * n_heads};
          AttentionSpanPartials(c.view, table, q.data(), n_heads, pos, part,
                                first % 2 == 0 ? &pool : nullptr);
        }
        std::vector<float> folded(row), direct(row);
        FoldAttentionPartials(SpanPartials{0, n_spans, n_heads, out.data(), max.data(), sum.data()},
                              n_heads, head_dim, folded.data());
        Attention(c.view, c.table, q.data(), n_heads, pos, direct.data());
        for (int64_t i = 0; i < row; ++i) {
          ASSERT_TRUE(BitEqual(direct[i], folded[i]))
              << "head_dim " << head_dim << " heads " << n_heads << " pos " << pos << " element "
              << i;
        }
      }
    }
  });
}

}  // namespace
}  // namespace tessera::kernels
