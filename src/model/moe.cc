#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "kernels/ops.h"
#include "model/llama_blocks.h"
#include "model/moe_ep.h"

namespace tessera::model {

void RouteToken(std::span<const float> router_logits, int64_t num_used, bool renormalize,
                std::span<ExpertChoice> out) {
  const size_t num_experts = router_logits.size();
  TESSERA_CHECK(num_used >= 1 && static_cast<size_t>(num_used) <= num_experts);
  TESSERA_CHECK_EQ(out.size(), static_cast<size_t>(num_used));
  float probs[4096];  // ModelConfig caps expert_count at 4096
  TESSERA_CHECK_LE(num_experts, std::size(probs));
  std::copy(router_logits.begin(), router_logits.end(), probs);
  kernels::Softmax(std::span<float>(probs, num_experts));
  // Top-k by probability, ties to the lower expert id.
  for (int64_t k = 0; k < num_used; ++k) {
    int32_t best = -1;
    for (size_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j)
        taken |= out[static_cast<size_t>(j)].expert == static_cast<int32_t>(e);
      if (taken) continue;
      if (best < 0 || probs[e] > probs[static_cast<size_t>(best)]) best = static_cast<int32_t>(e);
    }
    out[static_cast<size_t>(k)] = {best, probs[static_cast<size_t>(best)]};
  }
  if (renormalize) {
    float sum = 0;
    for (const ExpertChoice& choice : out) sum += choice.weight;
    for (ExpertChoice& choice : out) choice.weight /= sum;
  }
}

void NormAndRouteTokens(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                        LlamaScratch& s, ThreadPool& pool) {
  const int64_t dim = c.dim;
  const int64_t num_experts = c.num_experts, num_used = c.num_experts_used;
  const size_t T = static_cast<size_t>(num_tokens), K = static_cast<size_t>(num_used);
  s.h.resize(T * static_cast<size_t>(dim));
  NormRows(s.x.data(), w.ffn_norm, c.rms_eps, num_tokens, dim, s.h.data(), pool);
  s.router_logits.resize(T * static_cast<size_t>(num_experts));
  Linear(w.router, s.h.data(), num_tokens, s.router_logits.data(), pool);
  s.expert_choice.resize(T * K);
  s.expert_weight.resize(T * K);
  const bool renormalize = c.arch != "qwen2moe";
  std::vector<ExpertChoice> choices(K);
  for (size_t t = 0; t < T; ++t) {
    RouteToken(std::span<const float>(s.router_logits).subspan(t * num_experts, num_experts),
               num_used, renormalize, choices);
    for (size_t k = 0; k < K; ++k) {
      s.expert_choice[t * K + k] = choices[k].expert;
      s.expert_weight[t * K + k] = choices[k].weight;
    }
  }
  if (s.expert_rows_step.size() != static_cast<size_t>(num_experts)) {
    s.expert_rows_step.assign(static_cast<size_t>(num_experts), 0);
  }
}

void RunExpert(const ModelConfig& c, const LlamaLayerWeights& w, int32_t e,
               std::span<const int32_t> rows, LlamaScratch& s, ThreadPool& pool) {
  const int64_t dim = c.dim;
  const size_t K = static_cast<size_t>(c.num_experts_used);
  const int64_t n = static_cast<int64_t>(rows.size());
  s.expert_in.resize(static_cast<size_t>(n * dim));
  for (int64_t r = 0; r < n; ++r) {
    const size_t t = static_cast<size_t>(rows[static_cast<size_t>(r)]) / K;
    std::copy_n(s.h.data() + t * dim, dim, s.expert_in.data() + r * dim);
  }
  RunExpertOnInputs(c, w, e, n, s, pool);
}

void RunExpertOnInputs(const ModelConfig& c, const LlamaLayerWeights& w, int32_t e, int64_t n,
                       LlamaScratch& s, ThreadPool& pool) {
  const int64_t dim = c.dim;
  // proj holds the expert's output rows ([n, dim]; n may exceed proj's T rows).
  s.proj.resize(std::max(s.proj.size(), static_cast<size_t>(n * dim)));
  const size_t i = static_cast<size_t>(e);
  SwiGluFfn(w.expert_gate[i], w.expert_up[i], w.expert_down[i], s.expert_in.data(), n, s.gate, s.up,
            s.proj.data(), pool);
}

Status MoeBlock(const ModelConfig& c, const LlamaLayerWeights& w, int64_t num_tokens,
                LlamaScratch& s, ThreadPool& pool, TensorParallelOps* tp,
                const WeightMatrix* next) {
  const int64_t dim = c.dim;
  const int64_t num_experts = c.num_experts, num_used = c.num_experts_used;
  const size_t T = static_cast<size_t>(num_tokens), K = static_cast<size_t>(num_used);
  NormAndRouteTokens(c, w, num_tokens, s, pool);

  // Each expert runs once on the rows routed to it (gathered in token order); its
  // outputs land at (token, choice) so the mix below has a fixed order. The shared
  // expert's output follows them ([T, dim] after the T * K rows).
  const bool has_shared = !w.shared_ffn_gate.empty();
  const size_t out_rows = T * K + (has_shared ? T : 0);
  s.expert_out.resize(out_rows * static_cast<size_t>(dim));
  for (size_t i = 0; i < T * K; ++i) ++s.expert_rows_step[static_cast<size_t>(s.expert_choice[i])];
  for (int32_t e = 0; e < num_experts; ++e) {
    s.expert_rows.clear();
    for (size_t i = 0; i < T * K; ++i) {
      if (s.expert_choice[i] == e) s.expert_rows.push_back(static_cast<int32_t>(i));
    }
    if (s.expert_rows.empty()) continue;
    RunExpert(c, w, e, s.expert_rows, s, pool);
    for (size_t r = 0; r < s.expert_rows.size(); ++r) {
      std::copy_n(s.proj.data() + r * dim, dim,
                  s.expert_out.data() + static_cast<size_t>(s.expert_rows[r]) * dim);
    }
  }

  // qwen2moe: the shared expert's output, gated below per token by
  // sigmoid(shared_gate . h[t]).
  const size_t d = static_cast<size_t>(dim);
  float* shared_out = s.expert_out.data() + T * K * d;
  if (has_shared) {
    s.shared_gate.resize(T);
    Linear(w.shared_gate, s.h.data(), num_tokens, s.shared_gate.data(), pool);
    SwiGluFfn(w.shared_ffn_gate, w.shared_ffn_up, w.shared_ffn_down, s.h.data(), num_tokens, s.gate,
              s.up, shared_out, pool);
  }
  TESSERA_RETURN_IF_ERROR(
      ReduceRowParallel(std::span<float>(s.expert_out.data(), out_rows * d), tp, next));

  s.proj.resize(std::max(s.proj.size(), d));
  for (size_t t = 0; t < T; ++t) {
    MixExpertOutputs(
        std::span<const float>(s.expert_weight.data() + t * K, K),
        std::span<const float>(s.expert_out.data() + t * K * d, K * d),
        has_shared ? std::span<const float>(shared_out + t * d, d) : std::span<const float>(),
        has_shared ? s.shared_gate[t] : 0.0f, std::span<float>(s.x.data() + t * d, d),
        std::span<float>(s.proj.data(), d));
  }
  return Status::Ok();
}

}  // namespace tessera::model
