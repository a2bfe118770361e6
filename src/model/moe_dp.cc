#include "model/moe_dp.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/check.h"
#include "model/llama_blocks.h"
#include "model/moe.h"
#include "model/moe_ep.h"

namespace tessera::model {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

// Rows a peer may send in one layer: beyond any step a receiver accepts (its
// step limits bound its own tokens, not a peer's), so only a lying peer reaches it.
constexpr int64_t kMaxRowsFromPeer = int64_t{1} << 22;

// Which rank computes each of this rank's (token, choice) rows (s.ep_assign): this
// rank when it holds the expert, else its least-given holder (ties: first listed).
void AssignOwnRows(const parallel::ExpertHolders& holders, size_t rows, int ep, int me,
                   LlamaScratch& s) {
  std::vector<int64_t> given(static_cast<size_t>(ep), 0);
  s.ep_assign.resize(rows);
  for (size_t i = 0; i < rows; ++i) {
    const std::vector<int>& hs = holders[static_cast<size_t>(s.expert_choice[i])];
    int pick = hs[0];
    for (int h : hs) {
      if (h == me) {
        pick = me;
        break;
      }
      if (given[static_cast<size_t>(h)] < given[static_cast<size_t>(pick)]) pick = h;
    }
    ++given[static_cast<size_t>(pick)];
    s.ep_assign[i] = pick;
  }
}

// Checks the counts peers announced: no row for an expert this rank does not hold
// in this layer, none negative, a bounded total.
Status CheckCountsFrom(std::span<const int64_t> counts_from, std::span<const int32_t> held, int ep,
                       int me, size_t num_experts, int64_t layer) {
  std::vector<bool> holds(num_experts, false);
  for (const int32_t e : held) holds[static_cast<size_t>(e)] = true;
  for (int p = 0; p < ep; ++p) {
    int64_t total = 0;
    for (size_t e = 0; e < num_experts; ++e) {
      const int64_t n = counts_from[static_cast<size_t>(p) * num_experts + e];
      if (n < 0 || (n > 0 && (p == me || !holds[e]))) {
        return InvalidArgumentError("dp rank " + S(p) + " sends " + S(n) + " rows of expert " +
                                    S(static_cast<int64_t>(e)) + " in layer " + S(layer) +
                                    " to dp rank " + S(me) + ", which does not hold it");
      }
      total += n;
    }
    if (total > kMaxRowsFromPeer) {
      return InvalidArgumentError("dp rank " + S(p) + " announces " + S(total) +
                                  " expert rows in layer " + S(layer) + " (at most " +
                                  S(kMaxRowsFromPeer) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status MoeBlockDataParallel(const ModelConfig& c, const ShardLayout& layout, int64_t layer,
                            const LlamaLayerWeights& w, int64_t num_tokens, LlamaScratch& s,
                            ThreadPool& pool, TensorParallelOps& ops) {
  const size_t d = static_cast<size_t>(c.dim);
  const size_t T = static_cast<size_t>(num_tokens);
  const size_t K = static_cast<size_t>(c.num_experts_used);
  const size_t E = static_cast<size_t>(c.num_experts);
  const int ep = layout.ep_size, me = layout.ep_rank;
  const size_t peers = static_cast<size_t>(ep);
  if (T > 0) {
    NormAndRouteTokens(c, w, num_tokens, s, pool);
  } else {
    s.expert_choice.clear();
    if (s.expert_rows_step.size() != E) s.expert_rows_step.assign(E, 0);
  }
  AssignOwnRows(layout.expert_placement.Of(layout.layers.begin + layer), T * K, ep, me, s);

  // This rank's load: its tokens' rows routed to each expert.
  s.expert_rows_layer_step.resize(static_cast<size_t>(layout.layers.size()) * E, 0);
  int64_t* layer_rows = s.expert_rows_layer_step.data() + static_cast<size_t>(layer) * E;
  for (size_t i = 0; i < T * K; ++i) {
    const auto e = static_cast<size_t>(s.expert_choice[i]);
    ++s.expert_rows_step[e];
    ++layer_rows[e];
  }

  // Counts, then the rows to send bucketed by (peer, expert) in (token, choice) order.
  s.ep_counts_to.assign(peers * E, 0);
  for (size_t i = 0; i < T * K; ++i) {
    const int p = s.ep_assign[i];
    if (p != me)
      ++s.ep_counts_to[static_cast<size_t>(p) * E + static_cast<size_t>(s.expert_choice[i])];
  }
  s.ep_counts_from.assign(peers * E, 0);
  TESSERA_RETURN_IF_ERROR(ops.ExpertAllToAllCounts(s.ep_counts_to, s.ep_counts_from));
  TESSERA_RETURN_IF_ERROR(CheckCountsFrom(s.ep_counts_from,
                                          layout.held_experts[static_cast<size_t>(layer)], ep, me,
                                          E, layout.layers.begin + layer));
  std::vector<size_t> next(peers * E + 1, 0);  // each bucket's next slot in the send order
  for (size_t b = 0; b < peers * E; ++b)
    next[b + 1] = next[b] + static_cast<size_t>(s.ep_counts_to[b]);
  const size_t rows_sent = next[peers * E];
  s.ep_send_order.resize(rows_sent);
  s.ep_send.resize(rows_sent * d);
  for (size_t i = 0; i < T * K; ++i) {
    const int p = s.ep_assign[i];
    if (p == me) continue;
    const size_t j = next[static_cast<size_t>(p) * E + static_cast<size_t>(s.expert_choice[i])]++;
    s.ep_send_order[j] = static_cast<int32_t>(i);
    std::copy_n(s.h.data() + (i / K) * d, d, s.ep_send.data() + j * d);
  }
  s.ep_rows_to.assign(peers, 0);
  s.ep_rows_from.assign(peers, 0);
  std::vector<size_t> from_offset(peers * E + 1, 0);  // each (peer, expert) block in ep_recv
  for (size_t p = 0; p < peers; ++p) {
    for (size_t e = 0; e < E; ++e) {
      const size_t b = p * E + e;
      s.ep_rows_to[p] += static_cast<size_t>(s.ep_counts_to[b]);
      s.ep_rows_from[p] += static_cast<size_t>(s.ep_counts_from[b]);
      from_offset[b + 1] = from_offset[b] + static_cast<size_t>(s.ep_counts_from[b]);
    }
  }
  const size_t rows_received = from_offset[peers * E];
  s.ep_recv.resize(rows_received * d);
  TESSERA_RETURN_IF_ERROR(
      ops.ExpertAllToAllv(s.ep_send, s.ep_rows_to, s.ep_recv, s.ep_rows_from, c.dim));

  // Each held expert once: this rank's rows, then each peer's; the peers' outputs
  // overwrite their inputs in ep_recv, the layout the combine sends back.
  s.expert_out.resize(T * K * d);
  for (const int32_t e : layout.held_experts[static_cast<size_t>(layer)]) {
    s.expert_rows.clear();
    for (size_t i = 0; i < T * K; ++i) {
      if (s.expert_choice[i] == e && s.ep_assign[i] == me) {
        s.expert_rows.push_back(static_cast<int32_t>(i));
      }
    }
    const size_t own = s.expert_rows.size();
    size_t n = own;
    for (size_t p = 0; p < peers; ++p) n += static_cast<size_t>(s.ep_counts_from[p * E + e]);
    if (n == 0) continue;
    s.expert_in.resize(n * d);
    for (size_t r = 0; r < own; ++r) {
      std::copy_n(s.h.data() + (static_cast<size_t>(s.expert_rows[r]) / K) * d, d,
                  s.expert_in.data() + r * d);
    }
    size_t at = own;
    for (size_t p = 0; p < peers; ++p) {
      const size_t b = p * E + static_cast<size_t>(e);
      const size_t rows = from_offset[b + 1] - from_offset[b];
      std::copy_n(s.ep_recv.data() + from_offset[b] * d, rows * d, s.expert_in.data() + at * d);
      at += rows;
    }
    RunExpertOnInputs(c, w, e, static_cast<int64_t>(n), s, pool);
    s.expert_rows_computed_step += static_cast<int64_t>(n);
    for (size_t r = 0; r < own; ++r) {
      std::copy_n(s.proj.data() + r * d, d,
                  s.expert_out.data() + static_cast<size_t>(s.expert_rows[r]) * d);
    }
    at = own;
    for (size_t p = 0; p < peers; ++p) {
      const size_t b = p * E + static_cast<size_t>(e);
      const size_t rows = from_offset[b + 1] - from_offset[b];
      std::copy_n(s.proj.data() + at * d, rows * d, s.ep_recv.data() + from_offset[b] * d);
      at += rows;
    }
  }

  // Combine: the outputs go back in the order their inputs came.
  TESSERA_RETURN_IF_ERROR(
      ops.ExpertAllToAllv(s.ep_recv, s.ep_rows_from, s.ep_send, s.ep_rows_to, c.dim));
  for (size_t j = 0; j < rows_sent; ++j) {
    std::copy_n(s.ep_send.data() + j * d, d,
                s.expert_out.data() + static_cast<size_t>(s.ep_send_order[j]) * d);
  }
  // Counted as the combine moved them (as moe_ep.cc counts): the outputs this rank
  // returned, and those it got back; the dispatch is their mirror image.
  s.ep_rows_sent_step += static_cast<int64_t>(rows_received);
  s.ep_rows_received_step += static_cast<int64_t>(rows_sent);
  if (T == 0) return Status::Ok();

  // The shared expert (whole here) on this rank's tokens, then the one-rank mix.
  const bool has_shared = !w.shared_ffn_gate.empty();
  std::vector<float>& shared_out = s.ep_recv;  // free after the combine
  if (has_shared) {
    s.shared_gate.resize(T);
    Linear(w.shared_gate, s.h.data(), num_tokens, s.shared_gate.data(), pool);
    shared_out.resize(T * d);
    SwiGluFfn(w.shared_ffn_gate, w.shared_ffn_up, w.shared_ffn_down, s.h.data(), num_tokens, s.gate,
              s.up, shared_out.data(), pool);
  }
  s.proj.resize(std::max(s.proj.size(), d));
  for (size_t t = 0; t < T; ++t) {
    MixExpertOutputs(std::span<const float>(s.expert_weight.data() + t * K, K),
                     std::span<const float>(s.expert_out.data() + t * K * d, K * d),
                     has_shared ? std::span<const float>(shared_out.data() + t * d, d)
                                : std::span<const float>(),
                     has_shared ? s.shared_gate[t] : 0.0f, std::span<float>(s.x.data() + t * d, d),
                     std::span<float>(s.proj.data(), d));
  }
  return Status::Ok();
}

}  // namespace tessera::model
