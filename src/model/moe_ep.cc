#include "model/moe_ep.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "kernels/ops.h"
#include "model/llama_blocks.h"
#include "model/moe.h"
#include "model/shard.h"

namespace tessera::model {

TokenChunk ChunkOf(int64_t num_tokens, int parts, int index) {
  TESSERA_CHECK(parts >= 1 && index >= 0 && index < parts) << index << " of " << parts;
  const int64_t base = num_tokens / parts, extra = num_tokens % parts;
  const int64_t begin = base * index + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

void MixExpertOutputs(std::span<const float> weights, std::span<const float> outs,
                      std::span<const float> shared_out, float shared_gate_logit,
                      std::span<float> x, std::span<float> mix) {
  const size_t d = x.size();
  TESSERA_CHECK_EQ(outs.size(), weights.size() * d);
  TESSERA_CHECK_EQ(mix.size(), d);
  std::fill(mix.begin(), mix.end(), 0.0f);
  for (size_t k = 0; k < weights.size(); ++k) {
    kernels::ScaleAdd(weights[k], outs.subspan(k * d, d), mix);
  }
  kernels::Add(x, mix, x);
  if (!shared_out.empty()) {
    const float gate = 1.0f / (1.0f + std::exp(-shared_gate_logit));
    kernels::ScaleAdd(gate, shared_out, x);
  }
}

void AssignExpertRows(const parallel::ExpertHolders& table, int64_t num_tokens, size_t K,
                      int tp_size, int group_first, int ep, LlamaScratch& s) {
  const int64_t begin = ChunkOf(num_tokens, tp_size, group_first).begin;
  const int64_t end = ChunkOf(num_tokens, tp_size, group_first + ep - 1).end;
  s.ep_assign.assign(static_cast<size_t>(end - begin) * K, -1);
  std::vector<int64_t> assigned(static_cast<size_t>(ep), 0);
  for (int p = 0; p < ep; ++p) {
    const TokenChunk chunk = ChunkOf(num_tokens, tp_size, group_first + p);
    for (size_t i = static_cast<size_t>(chunk.begin) * K; i < static_cast<size_t>(chunk.end) * K;
         ++i) {
      const std::vector<int>& holders = table[static_cast<size_t>(s.expert_choice[i])];
      // The least loaded holder; on a tie the token's own rank (nothing to send
      // back), else the first listed.
      int pick = holders[0];
      for (int h : holders) {
        const int64_t a = assigned[static_cast<size_t>(h)], b = assigned[static_cast<size_t>(pick)];
        if (a < b || (a == b && h == p)) pick = h;
      }
      ++assigned[static_cast<size_t>(pick)];
      s.ep_assign[i - static_cast<size_t>(begin) * K] = pick;
    }
  }
}

Status MoeBlockExpertParallel(const ModelConfig& c, const ShardLayout& layout, int64_t layer,
                              const LlamaLayerWeights& w, int64_t num_tokens, LlamaScratch& s,
                              ThreadPool& pool, TensorParallelOps& tp) {
  const int64_t dim = c.dim;
  const size_t d = static_cast<size_t>(dim);
  const int64_t T = num_tokens;
  const size_t K = static_cast<size_t>(c.num_experts_used);
  const int ep = layout.ep_size, me = layout.ep_rank, tp_size = layout.tp_size;
  const int group_first = layout.tp_rank - me;  // tp rank of EP rank 0 of this group
  NormAndRouteTokens(c, w, num_tokens, s, pool);
  // The group's tokens: its members' chunks, contiguous.
  const TokenChunk mine = ChunkOf(T, tp_size, layout.tp_rank);
  const TokenChunk group{ChunkOf(T, tp_size, group_first).begin,
                         ChunkOf(T, tp_size, group_first + ep - 1).end};
  AssignExpertRows(layout.expert_placement.Of(layout.layers.begin + layer), T, K, tp_size,
                   group_first, ep, s);
  auto owner_of = [&](size_t row) {  // the EP rank computing (token, choice) `row`
    return s.ep_assign[row - static_cast<size_t>(group.begin) * K];
  };

  // The group's load: rows routed to each expert (the owners run exactly these).
  const size_t num_experts = static_cast<size_t>(c.num_experts);
  s.expert_rows_layer_step.resize(static_cast<size_t>(layout.layers.size()) * num_experts, 0);
  int64_t* layer_rows = s.expert_rows_layer_step.data() + static_cast<size_t>(layer) * num_experts;
  for (size_t i = static_cast<size_t>(group.begin) * K; i < static_cast<size_t>(group.end) * K;
       ++i) {
    const auto e = static_cast<size_t>(s.expert_choice[i]);
    ++s.expert_rows_step[e];
    ++layer_rows[e];
  }

  // Each local expert once, on the group's rows routed to it, in token order.
  s.expert_out.resize(static_cast<size_t>(T) * K * d);
  for (const int32_t e : layout.held_experts[static_cast<size_t>(layer)]) {
    s.expert_rows.clear();
    for (size_t i = static_cast<size_t>(group.begin) * K; i < static_cast<size_t>(group.end) * K;
         ++i) {
      if (s.expert_choice[i] == e && owner_of(i) == me) {
        s.expert_rows.push_back(static_cast<int32_t>(i));
      }
    }
    if (s.expert_rows.empty()) continue;
    s.expert_rows_computed_step += static_cast<int64_t>(s.expert_rows.size());
    RunExpert(c, w, static_cast<int32_t>(e), s.expert_rows, s, pool);
    for (size_t r = 0; r < s.expert_rows.size(); ++r) {
      std::copy_n(s.proj.data() + r * d, d,
                  s.expert_out.data() + static_cast<size_t>(s.expert_rows[r]) * d);
    }
  }

  // Combine: the rows computed here for a peer's tokens go back to it, packed peer
  // by peer in (token, choice) order; the peers' rows for this rank's tokens
  // arrive in the same order.
  s.ep_rows_to.assign(static_cast<size_t>(ep), 0);
  s.ep_rows_from.assign(static_cast<size_t>(ep), 0);
  s.ep_send.clear();
  for (int p = 0; p < ep; ++p) {
    if (p == me) continue;
    const TokenChunk theirs = ChunkOf(T, tp_size, group_first + p);
    for (size_t i = static_cast<size_t>(theirs.begin) * K; i < static_cast<size_t>(theirs.end) * K;
         ++i) {
      if (owner_of(i) != me) continue;
      s.ep_send.insert(s.ep_send.end(), s.expert_out.begin() + static_cast<ptrdiff_t>(i * d),
                       s.expert_out.begin() + static_cast<ptrdiff_t>((i + 1) * d));
      ++s.ep_rows_to[static_cast<size_t>(p)];
    }
  }
  size_t rows_received = 0;
  for (size_t i = static_cast<size_t>(mine.begin) * K; i < static_cast<size_t>(mine.end) * K; ++i) {
    const int p = owner_of(i);
    if (p != me) {
      ++s.ep_rows_from[static_cast<size_t>(p)];
      ++rows_received;
    }
  }
  s.ep_recv.resize(rows_received * d);
  TESSERA_RETURN_IF_ERROR(
      tp.ExpertAllToAllv(s.ep_send, s.ep_rows_to, s.ep_recv, s.ep_rows_from, dim));
  {
    std::vector<size_t> next_row(static_cast<size_t>(ep), 0);  // per peer, in its block
    size_t offset = 0;
    for (int p = 0; p < ep; ++p) {
      next_row[static_cast<size_t>(p)] = offset;
      offset += s.ep_rows_from[static_cast<size_t>(p)];
    }
    for (size_t i = static_cast<size_t>(mine.begin) * K; i < static_cast<size_t>(mine.end) * K;
         ++i) {
      const int p = owner_of(i);
      if (p == me) continue;
      const size_t row = next_row[static_cast<size_t>(p)]++;
      std::copy_n(s.ep_recv.data() + row * d, d, s.expert_out.data() + i * d);
    }
  }
  for (size_t p = 0; p < static_cast<size_t>(ep); ++p) {
    s.ep_rows_sent_step += static_cast<int64_t>(s.ep_rows_to[p]);
    s.ep_rows_received_step += static_cast<int64_t>(s.ep_rows_from[p]);
  }

  // The shared expert (whole here) on this rank's tokens.
  const bool has_shared = !w.shared_ffn_gate.empty();
  const int64_t n_mine = mine.size();
  std::vector<float>& shared_out = s.ep_recv;  // [n_mine, dim] (its rows are placed above)
  if (has_shared && n_mine > 0) {
    const float* h_mine = s.h.data() + static_cast<size_t>(mine.begin) * d;
    s.shared_gate.resize(static_cast<size_t>(n_mine));
    Linear(w.shared_gate, h_mine, n_mine, s.shared_gate.data(), pool);
    shared_out.resize(static_cast<size_t>(n_mine) * d);
    SwiGluFfn(w.shared_ffn_gate, w.shared_ffn_up, w.shared_ffn_down, h_mine, n_mine, s.gate, s.up,
              shared_out.data(), pool);
  }

  // Mix this rank's tokens into its block of the all-gather buffer (a copy of
  // their x rows), then gather every rank's block: [tp, ⌈T/tp⌉, dim].
  const size_t block_rows = static_cast<size_t>(ChunkOf(T, tp_size, 0).size());
  s.ep_send.assign(static_cast<size_t>(tp_size) * block_rows * d, 0.0f);
  float* my_block = s.ep_send.data() + static_cast<size_t>(layout.tp_rank) * block_rows * d;
  s.proj.resize(std::max(s.proj.size(), d));
  for (int64_t t = mine.begin; t < mine.end; ++t) {
    const size_t ti = static_cast<size_t>(t), j = static_cast<size_t>(t - mine.begin);
    std::span<float> x(my_block + j * d, d);
    std::copy_n(s.x.data() + ti * d, d, x.data());
    MixExpertOutputs(std::span<const float>(s.expert_weight.data() + ti * K, K),
                     std::span<const float>(s.expert_out.data() + ti * K * d, K * d),
                     has_shared ? std::span<const float>(shared_out.data() + j * d, d)
                                : std::span<const float>(),
                     has_shared ? s.shared_gate[j] : 0.0f, x, std::span<float>(s.proj.data(), d));
  }
  TESSERA_RETURN_IF_ERROR(tp.AllGatherBlocks(s.ep_send, block_rows * d));
  for (int r = 0; r < tp_size; ++r) {
    const TokenChunk chunk = ChunkOf(T, tp_size, r);
    std::copy_n(s.ep_send.data() + static_cast<size_t>(r) * block_rows * d,
                static_cast<size_t>(chunk.size()) * d,
                s.x.data() + static_cast<size_t>(chunk.begin) * d);
  }
  return Status::Ok();
}

}  // namespace tessera::model
