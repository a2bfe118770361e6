#include "model/context_attention.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "../comm/comm_test_util.h"
#include "kernels/attention.h"
#include "parallel/context_shard.h"

namespace tessera::model {
namespace {

using kernels::KvLayout;
using kernels::KvType;

constexpr int64_t kBlock = 4;
constexpr int64_t kSpan = 8;  // two blocks a span; short, so that a test sequence has many

std::vector<float> RandomFloats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

bool BitEqual(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Sequences of the given lengths in one pool, blocks shuffled, a decode query at each
// sequence's last position.
struct Batch {
  KvLayout layout;
  int64_t n_heads = 0;
  int64_t n_blocks = 0;
  std::vector<uint8_t> k, v;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lengths;
  std::vector<std::vector<float>> q;
};

Batch MakeBatch(std::mt19937& rng, KvType type, int64_t head_dim, int64_t n_heads,
                int64_t n_kv_heads, const std::vector<int64_t>& lengths) {
  Batch b;
  b.layout = KvLayout{kBlock, n_kv_heads, head_dim, type};
  b.layout.span = kSpan;
  b.n_heads = n_heads;
  b.lengths = lengths;
  for (int64_t len : lengths) b.n_blocks += (len + kBlock - 1) / kBlock;
  const size_t pool_bytes = static_cast<size_t>(b.n_blocks * b.layout.BlockStride()) *
                            static_cast<size_t>(b.layout.ElemBytes());
  b.k.assign(pool_bytes, 0);
  b.v.assign(pool_bytes, 0);
  std::vector<int32_t> physical(static_cast<size_t>(b.n_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  size_t next = 0;
  for (int64_t len : lengths) {
    std::vector<int32_t> table;
    for (int64_t i = 0; i < (len + kBlock - 1) / kBlock; ++i) table.push_back(physical[next++]);
    for (int64_t p = 0; p < len; ++p) {
      auto k = RandomFloats(rng, b.layout.TokenElems()),
           v = RandomFloats(rng, b.layout.TokenElems());
      kernels::StoreKv(b.layout, table, p, k.data(), v.data(), b.k.data(), b.v.data());
    }
    b.tables.push_back(std::move(table));
    b.q.push_back(RandomFloats(rng, n_heads * head_dim));
  }
  return b;
}

// What one rank holding only its spans has: a copy of the pool whose other blocks
// are garbage (0x7f bytes: 3.4e38 as f32, NaN as f16), tables whose other entries
// point nowhere.
struct RankView {
  std::vector<uint8_t> k, v;
  std::vector<std::vector<int32_t>> tables;
};

RankView ViewOfRank(const Batch& b, int rank, int cp) {
  RankView view{b.k, b.v, b.tables};
  const size_t block_bytes =
      static_cast<size_t>(b.layout.BlockStride()) * static_cast<size_t>(b.layout.ElemBytes());
  for (auto& table : view.tables) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (parallel::ContextSpanOwner(static_cast<int64_t>(i) * kBlock / kSpan, cp) == rank)
        continue;
      std::memset(view.k.data() + table[i] * block_bytes, 0x7f, block_bytes);
      std::memset(view.v.data() + table[i] * block_bytes, 0x7f, block_bytes);
      table[i] = -1;
    }
  }
  return view;
}

// Every rank of every cp, with the KV of each sequence spread over the ranks, gets
// the bits one rank's kernels::Attention gives over the whole sequence: f32 and f16,
// grouped heads and not, a sequence shorter than a span (only rank 0 holds any of
// it) and ones whose spans end mid-span and on a span's edge.
TEST(ContextParallelAttentionTest, EveryRankGetsOneRanksBits) {
  std::mt19937 rng(35);
  for (auto [type, head_dim, n_heads, n_kv_heads] :
       {std::tuple<KvType, int64_t, int64_t, int64_t>{KvType::kF32, 64, 2, 2},
        {KvType::kF16, 64, 8, 2},
        {KvType::kF16, 20, 4, 4}}) {
    const Batch b = MakeBatch(rng, type, head_dim, n_heads, n_kv_heads, {5, 40, 77, 64});
    const int64_t row = n_heads * head_dim;
    std::vector<std::vector<float>> direct;
    for (size_t s = 0; s < b.lengths.size(); ++s) {
      direct.emplace_back(row);
      kernels::Attention(kernels::PagedKv{b.layout, b.k.data(), b.v.data(), b.n_blocks},
                         b.tables[s], b.q[s].data(), n_heads, b.lengths[s] - 1,
                         direct.back().data());
    }
    for (int cp : {1, 2, 3, 4}) {
      comm::testing::RunRanks(
          cp, comm::testing::TestOptions(comm::TransportKind::kShm), [&](comm::Communicator& c) {
            const int rank = c.rank();
            RankView view = ViewOfRank(b, rank, cp);
            const kernels::PagedKv kv{b.layout, view.k.data(), view.v.data(), b.n_blocks};
            std::vector<std::vector<float>> out(b.lengths.size(), std::vector<float>(row));
            std::vector<ContextQuery> queries;
            for (size_t s = 0; s < b.lengths.size(); ++s) {
              queries.push_back({view.tables[s], b.q[s].data(), b.lengths[s] - 1, out[s].data()});
            }
            auto all_gather = [&](std::span<float> data, size_t block) {
              return c.AllGather(data.data() + static_cast<size_t>(rank) * block, data.data(),
                                 block, comm::DataType::kF32);
            };
            ThreadPool pool(2);
            std::vector<float> buffer;
            ASSERT_OK(ContextParallelAttention(kv, queries, n_heads, rank, cp, all_gather, buffer,
                                               rank % 2 == 0 ? &pool : nullptr));
            EXPECT_EQ(buffer.size(), static_cast<size_t>(cp) * ContextAttentionBlockFloats(
                                                                   b.layout, queries, n_heads, cp));
            for (size_t s = 0; s < b.lengths.size(); ++s) {
              for (int64_t i = 0; i < row; ++i) {
                ASSERT_TRUE(BitEqual(direct[s][i], out[s][i]))
                    << "cp " << cp << " rank " << rank << " sequence " << s << " (length "
                    << b.lengths[s] << ") element " << i << ": " << direct[s][i] << " vs "
                    << out[s][i] << ", head_dim " << head_dim << ", heads " << n_heads;
              }
            }
          });
    }
  }
}

// A block straddling two spans would have to live on two ranks: refused, saying why.
TEST(ContextParallelAttentionTest, SpanThatIsNotWholeBlocksIsRefused) {
  KvLayout layout{4, 1, 8, KvType::kF32};
  layout.span = 6;
  std::vector<float> pool(layout.BlockStride() * 2, 0.0f), q(8), out(8);
  const std::vector<int32_t> table = {0, 1};
  const ContextQuery query{table, q.data(), 5, out.data()};
  std::vector<float> buffer;
  const Status status = ContextParallelAttention(
      kernels::PagedKv{layout, pool.data(), pool.data(), 2}, std::span(&query, 1), 1, 0, 2,
      [](std::span<float>, size_t) { return Status::Ok(); }, buffer);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.ToString().find("span 6, block size 4"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace tessera::model
