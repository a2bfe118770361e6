#include "model/shard.h"

#include <algorithm>
#include <charconv>

#include "kernels/matmul.h"
#include "kernels/weight_type.h"

namespace tessera::model {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

// Rank r's share of n items split evenly over tp ranks (tp divides n).
Range EvenShare(int64_t n, int tp, int r) { return {n / tp * r, n / tp * (r + 1)}; }

Status CheckDivides(int tp, int64_t n, const char* what) {
  if (n % tp == 0) return Status::Ok();
  return InvalidArgumentError("tp (" + S(tp) + ") must divide the " + S(n) + " " + what);
}

// The row-parallel rule for one matrix: its K chunks must split evenly over tp.
Status CheckRowParallel(const GgufFile& file, const std::string& name, int tp) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return Status::Ok();  // ValidateModelTensors reports missing tensors
  const int64_t cols = t->dims[0];
  const int chunks = kernels::CanonicalKChunks(t->type, cols);
  if (chunks % tp == 0) return Status::Ok();
  return InvalidArgumentError(
      name + " (" + std::string(kernels::TraitsOf(t->type).name) + ", " + S(cols) +
      " columns) is reduced in " + S(chunks) + " K-chunk" + (chunks == 1 ? "" : "s") + " of " +
      S(cols / chunks) + " columns; a row-parallel split over tp=" + S(tp) +
      " must fall on chunk boundaries (so results stay bit-identical), which needs a multiple "
      "of " +
      S(tp) + " chunks");
}

}  // namespace

int ExpertOwner(int64_t expert, int64_t num_experts, int ep_size) {
  return static_cast<int>(expert / (num_experts / ep_size));
}

ModelConfig ShardLayout::LocalConfig(const ModelConfig& full) const {
  ModelConfig c = full;
  c.num_layers = layers.size();
  c.num_heads = heads.size();
  c.num_kv_heads = kv_heads.size();
  if (c.ffn_dim > 0) c.ffn_dim = ffn.size();
  if (c.expert_ffn_dim > 0) c.expert_ffn_dim = expert_ffn.size();
  if (c.shared_expert_ffn_dim > 0) c.shared_expert_ffn_dim = shared_ffn.size();
  return c;
}

Result<ShardLayout> ResolveShard(const ModelConfig& c, const ModelShard& shard) {
  const int tp = shard.tp_size, r = shard.tp_rank;
  if (tp < 1 || r < 0 || r >= tp) {
    return InvalidArgumentError("tensor-parallel rank " + S(r) + " of " + S(tp));
  }
  ShardLayout s;
  s.tp_rank = r;
  s.tp_size = tp;
  const int64_t end = shard.layer_end < 0 ? c.num_layers : shard.layer_end;
  if (shard.layer_begin < 0 || shard.layer_begin >= end || end > c.num_layers) {
    return InvalidArgumentError("layer range " + S(shard.layer_begin) + ".." + S(end - 1) +
                                " is not inside the model's " + S(c.num_layers) + " layers");
  }
  s.layers = {shard.layer_begin, end};
  s.first_stage = shard.layer_begin == 0;
  s.last_stage = end == c.num_layers;

  const int ep = shard.ep_size;
  if (ep < 1 || shard.ep_rank < 0 || shard.ep_rank >= ep ||
      (shard.dp_attention ? tp != 1 : tp % ep != 0)) {
    return InvalidArgumentError("expert-parallel rank " + S(shard.ep_rank) + " of " + S(ep) +
                                (shard.dp_attention
                                     ? " (data-parallel attention needs tp 1, got " + S(tp) + ")"
                                     : " (ep must divide tp, " + S(tp) + ")"));
  }
  if (shard.dp_attention && ep < 2) {
    return InvalidArgumentError("data-parallel attention needs 2 or more expert-parallel ranks");
  }
  if (ep > 1 && !c.is_moe()) {
    return InvalidArgumentError("--ep " + S(ep) + " needs a mixture-of-experts model; this " +
                                c.arch + " model is dense (no experts to spread)");
  }
  if (ep > 1 && c.num_experts % ep != 0) {
    return InvalidArgumentError("--ep " + S(ep) + " must divide the model's " + S(c.num_experts) +
                                " experts (each rank holds whole experts, the same number)");
  }
  TESSERA_RETURN_IF_ERROR(CheckDivides(tp, c.num_heads, "query heads"));
  s.heads = EvenShare(c.num_heads, tp, r);
  if (tp <= c.num_kv_heads) {
    TESSERA_RETURN_IF_ERROR(CheckDivides(tp, c.num_kv_heads, "KV heads"));
    s.kv_heads = EvenShare(c.num_kv_heads, tp, r);
  } else {
    // More ranks than KV heads: each KV head lives on tp / num_kv_heads ranks, each
    // of which holds only query heads of that KV head's group.
    if (tp % c.num_kv_heads != 0) {
      return InvalidArgumentError("tp (" + S(tp) + ") exceeds the " + S(c.num_kv_heads) +
                                  " KV heads and is not a multiple of them, so KV heads cannot "
                                  "be replicated evenly");
    }
    const int64_t head = r / (tp / c.num_kv_heads);
    s.kv_heads = {head, head + 1};
  }
  if (c.ffn_dim > 0) {
    TESSERA_RETURN_IF_ERROR(CheckDivides(tp, c.ffn_dim, "FFN rows"));
    s.ffn = EvenShare(c.ffn_dim, tp, r);
  }
  s.ep_rank = shard.ep_rank;
  s.ep_size = ep;
  if (shard.cp_size < 1 || shard.cp_rank < 0 || shard.cp_rank >= shard.cp_size) {
    return InvalidArgumentError("context-parallel rank " + S(shard.cp_rank) + " of " +
                                S(shard.cp_size));
  }
  s.cp_rank = shard.cp_rank;
  s.cp_size = shard.cp_size;
  s.dp_attention = shard.dp_attention;
  if (c.is_moe()) {
    if (ep > 1) {
      s.expert_ffn = {0, c.expert_ffn_dim};  // whole experts
      s.experts = EvenShare(c.num_experts, ep, shard.ep_rank);
      s.expert_placement = shard.expert_placement.empty()
                               ? parallel::ContiguousPlacement(c.num_experts, ep)
                               : shard.expert_placement;
      // Its structure (every expert held, ranks in range); PartitionForModel also
      // bounds each rank's copies by its slots.
      TESSERA_RETURN_IF_ERROR(parallel::CheckExpertPlacement(
          s.expert_placement, c.num_experts, ep, static_cast<int>(c.num_experts), c.num_layers));
      s.expert_slots = c.num_experts / ep + std::max(shard.ep_redundant, 0);
      for (int64_t l = s.layers.begin; l < s.layers.end; ++l) {
        s.held_experts.push_back(s.expert_placement.HeldBy(shard.ep_rank, l));
        s.expert_slots =
            std::max(s.expert_slots, static_cast<int64_t>(s.held_experts.back().size()));
      }
    } else {
      TESSERA_RETURN_IF_ERROR(CheckDivides(tp, c.expert_ffn_dim, "expert FFN rows"));
      s.expert_ffn = EvenShare(c.expert_ffn_dim, tp, r);
      s.experts = {0, c.num_experts};
      std::vector<int32_t> all(static_cast<size_t>(c.num_experts));
      for (int64_t e = 0; e < c.num_experts; ++e)
        all[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      s.held_experts.assign(static_cast<size_t>(s.layers.size()), all);
    }
  }
  if (c.shared_expert_ffn_dim > 0 && ep > 1) {
    s.shared_ffn = {0, c.shared_expert_ffn_dim};  // whole on every rank (moe_ep.h)
  } else if (c.shared_expert_ffn_dim > 0) {
    TESSERA_RETURN_IF_ERROR(CheckDivides(tp, c.shared_expert_ffn_dim, "shared-expert FFN rows"));
    s.shared_ffn = EvenShare(c.shared_expert_ffn_dim, tp, r);
  }
  s.vocab_block = (c.vocab_size + tp - 1) / tp;
  s.vocab = {std::min(c.vocab_size, s.vocab_block * r),
             std::min(c.vocab_size, s.vocab_block * (r + 1))};
  return s;
}

Result<ShardLayout> ValidateShard(const GgufFile& file, const ModelConfig& config,
                                  const ModelShard& shard) {
  TESSERA_ASSIGN_OR_RETURN(ShardLayout layout, ResolveShard(config, shard));
  if (layout.tp_size == 1) return layout;
  for (int64_t l = layout.layers.begin; l < layout.layers.end; ++l) {
    for (const char* suffix : {"attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight",
                               "ffn_down_shexp.weight"}) {
      // Under expert parallelism experts are held whole, not split by columns.
      if (layout.ep_size > 1 && std::string_view(suffix).find("_exps") != std::string_view::npos)
        continue;
      if (layout.ep_size > 1 && std::string_view(suffix).find("_shexp") != std::string_view::npos)
        continue;
      TESSERA_RETURN_IF_ERROR(CheckRowParallel(file, BlockTensorName(l, suffix), layout.tp_size));
    }
  }
  return layout;
}

ModelShard ShardOf(const parallel::Partition& plan, int rank) {
  const parallel::LayerRange layers = plan.stage_layers[static_cast<size_t>(plan.StageOf(rank))];
  return {.tp_rank = plan.TpRankOf(rank),
          .tp_size = plan.tp,
          .ep_rank = plan.EpRankOf(rank),
          .ep_size = plan.ep,
          .expert_placement = plan.expert_placement,
          .ep_redundant = plan.ep_redundant,
          .cp_rank = plan.CpRankOf(rank),
          .cp_size = plan.cp,
          .dp_attention = plan.dp > 1,
          .layer_begin = layers.begin,
          .layer_end = layers.end};
}

Result<parallel::Partition> PartitionForModel(const GgufFile& file, const ModelConfig& config,
                                              const parallel::PartitionRequest& request) {
  // Bytes of each layer's tensors ("blk.N.*") and of the output head.
  std::vector<int64_t> layer_bytes(static_cast<size_t>(config.num_layers), 0);
  for (const GgufTensor& t : file.tensors()) {
    if (!t.name.starts_with("blk.")) continue;
    int64_t layer = -1;
    const std::string_view rest = t.name.substr(4);
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
    if (ec == std::errc() && layer >= 0 && layer < config.num_layers) {
      layer_bytes[static_cast<size_t>(layer)] += static_cast<int64_t>(t.data.size());
    }
  }
  const GgufTensor* head =
      file.FindTensor(config.tied_output ? "token_embd.weight" : "output.weight");
  const int64_t head_bytes = head != nullptr ? static_cast<int64_t>(head->data.size()) : 0;
  TESSERA_ASSIGN_OR_RETURN(parallel::Partition plan,
                           parallel::MakePartition(request, layer_bytes, head_bytes));
  if (plan.sp && config.is_moe()) {
    return InvalidArgumentError("--sp runs dense models only; this one is a mixture of " +
                                std::to_string(config.num_experts) + " experts");
  }
  if (plan.ep > 1 && config.is_moe() && !plan.expert_placement.empty()) {
    TESSERA_RETURN_IF_ERROR(parallel::CheckExpertPlacement(plan.expert_placement,
                                                           config.num_experts, plan.ep,
                                                           plan.ep_redundant, config.num_layers)
                                .WithContext("--ep-placement"));
  }
  for (int rank = 0; rank < plan.world_size(); ++rank) {
    TESSERA_RETURN_IF_ERROR(ValidateShard(file, config, ShardOf(plan, rank)).status());
  }
  if (plan.ep > 1 && config.is_moe() && plan.expert_placement.empty()) {
    plan.expert_placement = parallel::ContiguousPlacement(config.num_experts, plan.ep);
  }
  return plan;
}

}  // namespace tessera::model
