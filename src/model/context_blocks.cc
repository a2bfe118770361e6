#include "model/context_blocks.h"

#include <algorithm>

#include "base/check.h"
#include "model/llama_blocks.h"
#include "parallel/context_shard.h"

namespace tessera::model {
namespace {

// The step-sized pools' layout: the cache's, its blocks packed.
kernels::KvLayout StepPoolLayout(const kernels::KvLayout& cache) {
  kernels::KvLayout layout = cache;
  layout.block_stride = 0;
  return layout;
}

// Floats of one rank's block of the K/V all-gather: K rows then V rows, room for
// the most rows any rank runs.
int64_t MaxRows(const ContextScratch& s) {
  return *std::max_element(s.rows_on_rank.begin(), s.rows_on_rank.end());
}

}  // namespace

void SplitContextStep(const ForwardBatch& batch, const kernels::KvLayout& layout,
                      const ContextGroup& cp, ContextScratch& s) {
  const size_t T = batch.tokens.size();
  s.split = true;
  s.row_owner.resize(T);
  s.row_local.resize(T);
  s.rows_on_rank.assign(static_cast<size_t>(cp.size), 0);
  s.tokens.clear();
  s.sequences.clear();
  s.run_sequence.clear();
  s.run_ring_step.clear();
  s.tables.clear();
  s.table_offset.assign(1, 0);
  size_t row = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const ForwardSequence& seq = batch.sequences[i];
    TESSERA_CHECK_EQ(seq.start_position, 0);
    bool in_run = false;
    int32_t latest = 0;  // the latest ring step among positions [0, p]
    for (int64_t p = 0; p < seq.num_tokens; ++p, ++row) {
      const int owner = parallel::ContextSpanOwner(p / layout.span, cp.size);
      s.row_owner[row] = owner;
      latest = std::max(latest, (cp.rank - owner + cp.size) % cp.size);  // its block's arrival
      s.row_local[row] = static_cast<int32_t>(s.rows_on_rank[static_cast<size_t>(owner)]++);
      if (owner != cp.rank) {
        in_run = false;
        continue;
      }
      if (!in_run) {
        s.sequences.push_back(
            {.num_tokens = 0, .start_position = p, .block_table = seq.block_table});
        s.run_sequence.push_back(static_cast<int32_t>(i));
        s.run_ring_step.push_back(0);
        in_run = true;
      }
      ++s.sequences.back().num_tokens;
      s.run_ring_step.back() = latest;
      s.tokens.push_back(batch.tokens[row]);
    }
    // The sequence's blocks in the step pools: the next ones, in order.
    const int64_t blocks = (seq.num_tokens + layout.block_size - 1) / layout.block_size;
    const int32_t first = static_cast<int32_t>(s.tables.size());
    for (int32_t b = 0; b < blocks; ++b) s.tables.push_back(first + b);
    s.table_offset.push_back(s.tables.size());
  }
  s.batch = {.tokens = s.tokens, .sequences = s.sequences};
}

Status AttentionBlockContextSplit(const ModelConfig& c, const kernels::RopeParams& rope,
                                  const LlamaLayerWeights& w, const ForwardBatch& batch,
                                  const KvView& kv, const KvLayerView& kv_layer,
                                  int64_t tile_tokens, LlamaScratch& s, ThreadPool& pool,
                                  TensorParallelOps* tp, const ContextGroup& cp) {
  ContextScratch& cs = s.cp;
  const ForwardBatch& mine = cs.batch;
  const int64_t rows = static_cast<int64_t>(mine.tokens.size());
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int64_t max_rows = MaxRows(cs);
  const size_t block = static_cast<size_t>(max_rows * 2 * kv_dim);
  // An f16 cache stores f16 K/V: each rank converts its own rows as StoreKv would
  // (KvHeadToF16, head by head), and the all-gather moves half the bytes for the
  // same bits in every pool.
  const bool f16 = kv.layout.type == kernels::KvType::kF16;

  // This rank's rows: Q kept, K and V into its block of the all-gather (and, by
  // ProjectQkvTile, into the cache).
  cs.q.resize(static_cast<size_t>(rows * q_dim));
  cs.kv.resize(block * static_cast<size_t>(f16 ? 1 : cp.size));
  float* k_rows = cs.kv.data() + (f16 ? 0 : static_cast<size_t>(cp.rank) * block);
  float* v_rows = k_rows + max_rows * kv_dim;
  const int64_t tile = std::max<int64_t>(1, std::min(tile_tokens, rows));
  s.h.resize(static_cast<size_t>(tile * dim));
  for (int64_t t0 = 0; t0 < rows; t0 += tile) {
    const int64_t n = std::min(tile, rows - t0);
    NormRows(s.x.data() + t0 * dim, w.attn_norm, c.rms_eps, n, dim, s.h.data(), pool);
    ProjectQkvTile(c, rope, w, mine, kv, kv_layer, cp, t0, n, s.h.data(), cs.q.data() + t0 * q_dim,
                   k_rows + t0 * kv_dim, v_rows + t0 * kv_dim, s, pool);
  }
  // f32 blocks, or f16 ones packed two values a float (block / 2 floats a rank).
  const size_t sent = f16 ? block / 2 : block;
  if (f16) {
    cs.kv_f16.resize(sent * static_cast<size_t>(cp.size));
    auto* mine =
        reinterpret_cast<uint16_t*>(cs.kv_f16.data() + static_cast<size_t>(cp.rank) * sent);
    const int64_t hd = kv.layout.head_dim;
    for (int64_t i = 0; i < rows * kv_dim; i += hd) {
      kernels::KvHeadToF16(k_rows + i, mine + i, hd);
      kernels::KvHeadToF16(v_rows + i, mine + max_rows * kv_dim + i, hd);
    }
  }
  std::vector<float>& exchanged = f16 ? cs.kv_f16 : cs.kv;  // [cp] blocks of `sent` floats

  const kernels::KvLayout layout = StepPoolLayout(kv.layout);
  const int64_t pool_blocks = static_cast<int64_t>(cs.tables.size());
  cs.pool_k.resize(static_cast<size_t>(pool_blocks * layout.BlockBytes()));
  cs.pool_v.resize(cs.pool_k.size());
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  // Owner `o`'s rows, from its block, into the step pools.
  auto store_rows_of = [&](int o) {
    const float* owner = exchanged.data() + static_cast<size_t>(o) * sent;
    pool.ParallelFor(T, [&](int64_t begin, int64_t end) {
      size_t seq = 0;
      int64_t seq_row = 0;  // the step row of sequence seq's position 0
      for (int64_t row = begin; row < end; ++row) {
        while (row >= seq_row + batch.sequences[seq].num_tokens) {
          seq_row += batch.sequences[seq].num_tokens;
          ++seq;
        }
        if (cs.row_owner[static_cast<size_t>(row)] != o) continue;
        const int64_t at = cs.row_local[static_cast<size_t>(row)] * kv_dim;
        const std::span<const int32_t> table(cs.tables.data() + cs.table_offset[seq],
                                             cs.table_offset[seq + 1] - cs.table_offset[seq]);
        if (f16) {
          const auto* k = reinterpret_cast<const uint16_t*>(owner) + at;
          kernels::StoreKvF16(layout, table, row - seq_row, k, k + max_rows * kv_dim,
                              cs.pool_k.data(), cs.pool_v.data());
        } else {
          const float* k = owner + at;
          kernels::StoreKv(layout, table, row - seq_row, k, k + max_rows * kv_dim, cs.pool_k.data(),
                           cs.pool_v.data());
        }
      }
    });
  };

  // The ring: at step i this rank holds the block of cp rank (rank - i) mod cp, passes
  // it on to the next rank while the previous one's arrives, and meanwhile stores it
  // and attends with every run of its rows whose sequence's positions up to the run's
  // end are all in the pools by then. Each run is computed once, over the same pools,
  // with the kernel one rank uses: the same bits as after an all-gather, in whatever
  // order the runs complete.
  const int n = cp.size;
  cs.attn.resize(static_cast<size_t>(rows * q_dim));
  std::vector<int64_t>& run_rows = cs.run_rows;
  run_rows.assign(1, 0);
  for (const ForwardSequence& run : mine.sequences)
    run_rows.push_back(run_rows.back() + run.num_tokens);
  const kernels::PagedKv paged{
      .layout = layout, .k = cs.pool_k.data(), .v = cs.pool_v.data(), .n_blocks = pool_blocks};
  auto attend = [&](size_t r, ThreadPool* inner) {
    const ForwardSequence& run = mine.sequences[r];
    const size_t seq = static_cast<size_t>(cs.run_sequence[r]);
    const std::span<const int32_t> table(cs.tables.data() + cs.table_offset[seq],
                                         cs.table_offset[seq + 1] - cs.table_offset[seq]);
    const int64_t row = run_rows[r];
    kernels::AttentionMulti(paged, table, cs.q.data() + row * q_dim, c.num_heads,
                            run.start_position, run.num_tokens, cs.attn.data() + row * q_dim,
                            inner);
  };
  std::vector<size_t> ready;
  for (int i = 0; i < n; ++i) {
    const int have = (cp.rank - i + n) % n;
    if (i + 1 < n) {
      const int next = (have + n - 1) % n;
      TESSERA_RETURN_IF_ERROR(cp.ops->ContextRingStart(
          std::span<const float>(exchanged.data() + static_cast<size_t>(have) * sent, sent),
          std::span<float>(exchanged.data() + static_cast<size_t>(next) * sent, sent)));
    }
    store_rows_of(have);
    ready.clear();
    for (size_t r = 0; r < cs.run_ring_step.size(); ++r) {
      if (cs.run_ring_step[r] == i) ready.push_back(r);
    }
    if (i + 1 < n) {
      // Run by run, moving the ring step on between them.
      for (const size_t r : ready) {
        attend(r, &pool);
        TESSERA_RETURN_IF_ERROR(cp.ops->ContextRingProgress());
      }
    } else if (ready.size() == 1) {
      attend(ready[0], &pool);
    } else if (!ready.empty()) {
      pool.ParallelFor(static_cast<int64_t>(ready.size()), [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) attend(ready[static_cast<size_t>(k)], nullptr);
      });
    }
    if (i + 1 < n) TESSERA_RETURN_IF_ERROR(cp.ops->ContextRingWait());
  }
  if (rows == 0) return Status::Ok();

  // The output projection of every row at once, all-reduced over tp, then the
  // bias and the residual add (the order AttentionBlock adds them in).
  s.proj.resize(static_cast<size_t>(rows * dim));
  Linear(w.wo, cs.attn.data(), rows, s.proj.data(), pool);
  TESSERA_RETURN_IF_ERROR(ReduceRowParallel(std::span<float>(s.proj.data(), s.proj.size()), tp,
                                            c.is_moe() ? nullptr : &w.ffn_gate));
  AddBias(s.proj.data(), w.bo, rows);
  AddInto(s.x.data(), s.proj.data(), rows * dim);
  return Status::Ok();
}

Status GatherContextHeadRows(const ModelConfig& config, std::span<const float> norm,
                             LlamaScratch& s, ThreadPool& pool, const ContextGroup& cp) {
  const int64_t dim = config.dim;
  const size_t rows = s.logit_rows.size();
  const size_t block = rows * static_cast<size_t>(dim);
  std::vector<float>& gathered = s.cp.kv;  // free after the layers
  gathered.assign(block * static_cast<size_t>(cp.size), 0.0f);
  float* mine = gathered.data() + static_cast<size_t>(cp.rank) * block;
  for (size_t r = 0; r < rows; ++r) {
    const size_t row = static_cast<size_t>(s.logit_rows[r]);
    if (s.cp.row_owner[row] != cp.rank) continue;
    NormRows(s.x.data() + int64_t{s.cp.row_local[row]} * dim, norm, config.rms_eps, 1, dim,
             mine + r * static_cast<size_t>(dim), pool);
  }
  TESSERA_RETURN_IF_ERROR(cp.ops->ContextAllGatherBlocks(std::span<float>(gathered), block));
  s.head_in.resize(block);
  for (size_t r = 0; r < rows; ++r) {
    const size_t owner = static_cast<size_t>(s.cp.row_owner[static_cast<size_t>(s.logit_rows[r])]);
    std::copy_n(gathered.data() + owner * block + r * static_cast<size_t>(dim), dim,
                s.head_in.data() + r * static_cast<size_t>(dim));
  }
  return Status::Ok();
}

}  // namespace tessera::model
