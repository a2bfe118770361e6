#include "model/llama.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/check.h"
#include "kernels/quantize.h"
#include "model/context_blocks.h"
#include "model/llama_blocks.h"
#include "model/moe.h"
#include "model/moe_dp.h"
#include "model/moe_ep.h"
#include "parallel/context_shard.h"

namespace tessera::model {

Result<LlamaModel> LlamaModel::Load(const GgufFile& file, const ModelShard& shard) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(file));
  TESSERA_ASSIGN_OR_RETURN(ShardLayout layout, ValidateShard(file, config, shard));
  TESSERA_ASSIGN_OR_RETURN(LlamaWeights weights, BindLlamaShard(file, config, layout));
  return LlamaModel(std::move(config), layout, std::move(weights));
}

LlamaModel::LlamaModel(ModelConfig config, ShardLayout layout, LlamaWeights weights)
    : config_(std::move(config)),
      layout_(layout),
      local_(layout_.LocalConfig(config_)),
      weights_(std::move(weights)),
      tile_tokens_(BlockTileTokens(local_, weights_.total_bytes)) {
  rope_.n_dims = static_cast<int>(config_.rope_dim);
  rope_.layout = config_.rope_layout == RopeLayout::kNeox ? kernels::RopeLayout::kNeox
                                                          : kernels::RopeLayout::kNormal;
  rope_.freq_base = config_.rope_theta;
  if (config_.rope_scaling != RopeScaling::kNone) {
    rope_.freq_scale = 1.0f / config_.rope_scaling_factor;
  }
  if (config_.rope_scaling == RopeScaling::kYarn) {
    rope_.ext_factor = config_.rope_yarn_ext_factor;
    rope_.attn_factor = config_.rope_yarn_attn_factor;
    rope_.beta_fast = config_.rope_yarn_beta_fast;
    rope_.beta_slow = config_.rope_yarn_beta_slow;
    rope_.n_ctx_orig = static_cast<int>(config_.rope_original_context);
  }
}

Status LlamaModel::SetExpertPlacement(const GgufFile& file,
                                      const parallel::ExpertPlacement& placement) {
  if (layout_.ep_size < 2 || !config_.is_moe()) {
    return InvalidArgumentError(
        "an expert placement needs expert parallelism on a mixture-of-experts model");
  }
  const int64_t homes = config_.num_experts / layout_.ep_size;
  TESSERA_RETURN_IF_ERROR(parallel::CheckExpertPlacement(
      placement, config_.num_experts, layout_.ep_size,
      static_cast<int>(layout_.expert_slots - homes), config_.num_layers));
  ShardLayout to = layout_;
  to.expert_placement = placement;
  to.held_experts.clear();
  for (int64_t l = layout_.layers.begin; l < layout_.layers.end; ++l) {
    to.held_experts.push_back(placement.HeldBy(layout_.ep_rank, l));
  }
  TESSERA_RETURN_IF_ERROR(RebindExperts(file, config_, layout_, to, weights_));
  layout_ = std::move(to);
  return Status::Ok();
}

Status LlamaModel::CheckBatch(const ForwardBatch& batch, const KvView& kv) const {
  // A dp rank with no sequence in a step still runs it (moe_dp.h).
  if (batch.sequences.empty() && !layout_.dp_attention) {
    return InvalidArgumentError("empty batch");
  }
  if (static_cast<int64_t>(kv.layers.size()) != local_.num_layers ||
      kv.layout.n_kv_heads != local_.num_kv_heads || kv.layout.head_dim != local_.head_dim) {
    return InvalidArgumentError("KV cache shape (" + std::to_string(kv.layers.size()) +
                                " layers, " + std::to_string(kv.layout.n_kv_heads) +
                                " kv heads, head_dim " + std::to_string(kv.layout.head_dim) +
                                ") does not match the model");
  }
  if (layout_.cp_size > 1 && kv.layout.span % kv.layout.block_size != 0) {
    return InvalidArgumentError("context parallelism needs whole KV blocks per attention span (" +
                                std::to_string(kv.layout.span) + " positions, blocks of " +
                                std::to_string(kv.layout.block_size) + ")");
  }
  int64_t total = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const ForwardSequence& seq = batch.sequences[s];
    if (seq.num_tokens < 1 || seq.start_position < 0) {
      return InvalidArgumentError("sequence " + std::to_string(s) + " of the batch has " +
                                  std::to_string(seq.num_tokens) + " new tokens at position " +
                                  std::to_string(seq.start_position));
    }
    const int64_t end = seq.start_position + seq.num_tokens;
    if (static_cast<int64_t>(seq.block_table.size()) * kv.layout.block_size < end) {
      return InvalidArgumentError(
          "sequence " + std::to_string(s) + " needs KV blocks for " + std::to_string(end) +
          " tokens, its table covers " +
          std::to_string(static_cast<int64_t>(seq.block_table.size()) * kv.layout.block_size));
    }
    // Under context parallelism this rank's cache holds its spans' blocks only; the
    // others' entries are never read.
    for (size_t j = 0; j < seq.block_table.size(); ++j) {
      const int32_t block = seq.block_table[j];
      if (layout_.cp_size > 1 &&
          parallel::ContextBlockOwner(static_cast<int64_t>(j), kv.layout.block_size, kv.layout.span,
                                      layout_.cp_size) != layout_.cp_rank) {
        continue;
      }
      if (block < 0 || block >= kv.num_blocks) {
        return InvalidArgumentError("KV block " + std::to_string(block) + " out of range [0, " +
                                    std::to_string(kv.num_blocks) + ")");
      }
    }
    total += seq.num_tokens;
  }
  if (total != static_cast<int64_t>(batch.tokens.size())) {
    return InvalidArgumentError("batch has " + std::to_string(batch.tokens.size()) +
                                " tokens, its sequences " + std::to_string(total));
  }
  for (int32_t token : batch.tokens) {
    if (token < 0 || token >= config_.vocab_size) {
      return InvalidArgumentError("token id " + std::to_string(token) +
                                  " outside the vocabulary (" + std::to_string(config_.vocab_size) +
                                  ")");
    }
  }
  return Status::Ok();
}

Status LlamaModel::BeginStep(const ForwardBatch& batch, const KvView& kv, LlamaScratch& s) const {
  TESSERA_RETURN_IF_ERROR(CheckBatch(batch, kv));
  const ModelConfig& c = local_;
  const size_t T = batch.tokens.size();
  if (SequenceParallel(batch)) {
    if (c.is_moe()) {
      return InvalidArgumentError("sequence parallelism runs dense models only (this one has " +
                                  std::to_string(c.num_experts) + " experts)");
    }
    s.cp.split = false;  // MakePartition refuses --sp with --cp
    s.sp_chunks = parallel::SequenceChunks(static_cast<int64_t>(T), layout_.tp_size);
    s.x.resize(static_cast<size_t>(
        parallel::SequenceShardRows(static_cast<int64_t>(T), layout_.tp_size) * c.dim));
  } else if (ContextSplit(batch)) {
    s.sp_chunks.clear();
    SplitContextStep(batch, kv.layout, Context(nullptr), s.cp);
    s.x.resize(s.cp.tokens.size() * c.dim);  // this rank's rows
  } else {
    s.sp_chunks.clear();
    s.cp.split = false;
    s.x.resize(T * c.dim);  // the blocks size their own tiles (llama_blocks.cc)
  }
  // The rows whose logits are wanted.
  s.logit_rows.clear();
  int64_t t = 0;
  for (const ForwardSequence& seq : batch.sequences) {
    for (int64_t i = 0; i < seq.num_tokens; ++i, ++t) {
      if (batch.all_logits || seq.all_logits || i == seq.num_tokens - 1) {
        s.logit_rows.push_back(static_cast<int32_t>(t));
      }
    }
  }
  return Status::Ok();
}

Status TensorParallelOps::ExpertAllToAllv(std::span<const float>, std::span<const size_t>,
                                          std::span<float>, std::span<const size_t>, int64_t) {
  return InternalError("expert parallelism needs a runner with an EP group");
}

Status TensorParallelOps::ExpertAllToAllCounts(std::span<const int64_t>, std::span<int64_t>) {
  return InternalError("data-parallel attention needs a runner with an EP group");
}

Status TensorParallelOps::AllGatherBlocks(std::span<float>, size_t) {
  return InternalError("this tensor-parallel group has no all-gather");
}

Status TensorParallelOps::ContextAllGatherBlocks(std::span<float>, size_t) {
  return InternalError("context parallelism needs a runner with a cp group");
}

Status TensorParallelOps::ContextRingStart(std::span<const float>, std::span<float>) {
  return InternalError("context parallelism needs a runner with a cp group");
}

Status TensorParallelOps::ContextRingProgress() {
  return InternalError("context parallelism needs a runner with a cp group");
}

Status TensorParallelOps::ContextRingWait() {
  return InternalError("context parallelism needs a runner with a cp group");
}

Status TensorParallelOps::ReduceScatterSum(std::span<const float>, std::span<float>) {
  return InternalError("this tensor-parallel group has no reduce-scatter");
}

int64_t LlamaScratch::CapacityBytes() const {
  int64_t bytes = 0;
  auto add = [&bytes](const auto& buffer) {
    bytes += static_cast<int64_t>(buffer.capacity() * sizeof(buffer[0]));
  };
  for (const auto* buffer :
       {&x, &h, &q, &k, &v, &attn, &proj, &gate, &up, &router_logits, &expert_weight, &expert_in,
        &expert_out, &shared_gate, &ep_send, &ep_recv, &head_in, &sp_piece}) {
    add(*buffer);
  }
  for (const auto* buffer :
       {&expert_choice, &expert_rows, &ep_send_order, &ep_assign, &logit_rows}) {
    add(*buffer);
  }
  add(expert_rows_step);
  add(expert_rows_layer_step);
  add(ep_rows_to);
  add(ep_rows_from);
  add(ep_counts_to);
  add(ep_counts_from);
  add(tile_segments);
  add(sp_chunks);
  return bytes;
}

bool LlamaModel::ContextSplit(const ForwardBatch& batch) const {
  if (layout_.cp_size == 1) return false;
  for (const ForwardSequence& seq : batch.sequences) {
    if (seq.start_position != 0) return false;
  }
  return true;
}

ContextGroup LlamaModel::Context(TensorParallelOps* ops) const {
  return {.rank = layout_.cp_rank, .size = layout_.cp_size, .ops = ops};
}

size_t LlamaModel::ActivationBytes(const ForwardBatch& batch, const LlamaScratch& s) const {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  int64_t rows = T;
  if (SequenceParallel(batch)) {
    rows = parallel::SequenceShardRows(T, layout_.tp_size);
  } else if (s.cp.split) {
    rows = static_cast<int64_t>(s.cp.tokens.size());  // this rank's rows
  }
  return static_cast<size_t>(rows * config_.dim) * sizeof(float);
}

Status LlamaModel::Embed(const ForwardBatch& batch, LlamaScratch& s, TensorParallelOps* tp) const {
  TESSERA_CHECK(layout_.first_stage);
  // x[t] = token_embd[token], dequantised. Under tp each rank holds a vocab range
  // and writes -0.0 for the others' tokens: -0.0 is the exact identity of float
  // addition (x + -0.0 == x for every x, +0.0 and -0.0 included), so the all-reduce
  // reproduces the owner's row bit for bit.
  // A head tied to the embedding on this rank is interleaved for the matmul
  // (llama_weights.cc); its rows are read back into the GGUF layout first.
  const WeightMatrix& embd = weights_.token_embd;
  const int64_t dim = config_.dim;
  std::vector<uint8_t> gguf_row;
  if (embd.layout != kernels::WeightLayout::kRows) {
    gguf_row.resize(static_cast<size_t>(*kernels::RowBytes(embd.type, dim)));
  }
  auto embed_row = [&](int64_t token, float* row) {
    if (token >= layout_.vocab.begin && token < layout_.vocab.end) {
      const int64_t r = token - layout_.vocab.begin;
      const uint8_t* bytes = gguf_row.data();
      if (gguf_row.empty()) {
        bytes = embd.row(r);
      } else {
        kernels::GgufRow(embd.view(), r, gguf_row.data());
      }
      kernels::DequantizeRow(embd.type, bytes, dim, row);
    } else {
      std::fill(row, row + dim, -0.0f);
    }
  };
  if (SequenceParallel(batch)) {
    // Chunk by chunk: the rows' partial embeddings (padding -0.0), reduce-scattered
    // straight into this rank's pieces.
    for (const parallel::SequenceChunk& chunk : s.sp_chunks) {
      const size_t block = static_cast<size_t>(chunk.piece * dim);
      s.proj.assign(block * static_cast<size_t>(layout_.tp_size), -0.0f);
      for (int64_t i = 0; i < chunk.n; ++i) {
        embed_row(batch.tokens[static_cast<size_t>(chunk.row + i)], s.proj.data() + i * dim);
      }
      TESSERA_RETURN_IF_ERROR(tp->ReduceScatterSum(
          s.proj, std::span<float>(s.x.data() + chunk.shard_row * dim, block)));
    }
    return Status::Ok();
  }
  // A split context-parallel step embeds this rank's rows only.
  const std::span<const int32_t> tokens = s.cp.split ? s.cp.batch.tokens : batch.tokens;
  for (size_t i = 0; i < tokens.size(); ++i) embed_row(tokens[i], s.x.data() + i * dim);
  if (tp != nullptr && layout_.tp_size > 1 && !tokens.empty()) {
    return tp->AllReduceSum(s.x, weights_.layers.empty() ? nullptr : &weights_.layers[0].wq);
  }
  return Status::Ok();
}

Status LlamaModel::LayerKvDone(const ForwardBatch& batch, int64_t local_layer) const {
  if (batch.on_layer_kv == nullptr) return Status::Ok();
  return (*batch.on_layer_kv)(layout_.layers.begin + local_layer);
}

Status LlamaModel::RunLayers(const ForwardBatch& batch, const KvView& kv, LlamaScratch& s,
                             ThreadPool& pool, TensorParallelOps* tp) const {
  const ModelConfig& c = local_;
  if (layout_.tp_size > 1) TESSERA_CHECK(tp != nullptr);
  if (layout_.cp_size > 1) TESSERA_CHECK(tp != nullptr);  // the runner's ops carry the cp group
  const ContextGroup cp = Context(tp);
  TensorParallelOps* const dp_ops = layout_.dp_attention ? tp : nullptr;  // its MoE exchanges
  if (layout_.dp_attention) TESSERA_CHECK(dp_ops != nullptr);
  if (layout_.tp_size == 1) tp = nullptr;  // from here on: the tensor-parallel collectives
  // A split context-parallel step runs this rank's rows; the others, every row.
  const int64_t num_tokens =
      static_cast<int64_t>(s.cp.split ? s.cp.batch.tokens.size() : batch.tokens.size());
  if (SequenceParallel(batch)) {
    TESSERA_CHECK(!c.is_moe());  // BeginStep refuses it
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
      TESSERA_RETURN_IF_ERROR(AttentionBlockSequenceParallel(c, rope_, w, batch, kv,
                                                             kv.layers[static_cast<size_t>(l)],
                                                             layout_, tile_tokens_, s, pool, *tp));
      TESSERA_RETURN_IF_ERROR(LayerKvDone(batch, l));
      TESSERA_RETURN_IF_ERROR(
          DenseFfnBlockSequenceParallel(c, w, layout_, tile_tokens_, s, pool, *tp));
    }
    return Status::Ok();
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    const KvLayerView& kv_layer = kv.layers[static_cast<size_t>(l)];
    if (dp_ops != nullptr) {
      // Attention on this rank's sequences (none in a padding step), then the
      // experts' exchange every dp rank enters.
      if (num_tokens > 0) {
        TESSERA_RETURN_IF_ERROR(
            AttentionBlock(c, rope_, w, batch, kv, kv_layer, tile_tokens_, s, pool, tp, cp));
      }
      TESSERA_RETURN_IF_ERROR(LayerKvDone(batch, l));
      TESSERA_RETURN_IF_ERROR(MoeBlockDataParallel(c, layout_, l, w, num_tokens, s, pool, *dp_ops));
      continue;
    }
    if (s.cp.split) {
      TESSERA_RETURN_IF_ERROR(AttentionBlockContextSplit(c, rope_, w, batch, kv, kv_layer,
                                                         tile_tokens_, s, pool, tp, cp));
      TESSERA_RETURN_IF_ERROR(LayerKvDone(batch, l));
      if (num_tokens == 0) continue;  // this rank holds none of the step's spans
    } else {
      TESSERA_RETURN_IF_ERROR(
          AttentionBlock(c, rope_, w, batch, kv, kv_layer, tile_tokens_, s, pool, tp, cp));
      TESSERA_RETURN_IF_ERROR(LayerKvDone(batch, l));
    }
    // What the layer's last all-reduce can warm while it waits: the next layer's
    // first matrix, or the head after the last layer.
    const WeightMatrix* next = nullptr;
    if (l + 1 < c.num_layers) {
      next = &weights_.layers[static_cast<size_t>(l + 1)].wq;
    } else if (layout_.last_stage) {
      next = &weights_.output;
    }
    if (c.is_moe() && layout_.ep_size > 1) {
      TESSERA_CHECK(tp != nullptr);
      TESSERA_RETURN_IF_ERROR(MoeBlockExpertParallel(c, layout_, l, w, num_tokens, s, pool, *tp));
    } else if (c.is_moe()) {
      TESSERA_RETURN_IF_ERROR(MoeBlock(c, w, num_tokens, s, pool, tp, next));
    } else {
      TESSERA_RETURN_IF_ERROR(DenseFfnBlock(c, w, num_tokens, tile_tokens_, s, pool, tp, next));
    }
  }
  return Status::Ok();
}

Status LlamaModel::Head(const ForwardBatch& batch, LlamaScratch& s, ThreadPool& pool,
                        std::vector<float>& logits, TensorParallelOps* tp) const {
  TESSERA_CHECK(layout_.last_stage);
  const int64_t dim = config_.dim;
  const size_t rows = s.logit_rows.size();
  if (rows == 0) {  // a dp rank's padding step
    logits.clear();
    return Status::Ok();
  }
  if (SequenceParallel(batch)) {
    // Each row is normalised by the rank holding it; the others contribute -0.0,
    // the exact identity of the sum (as in Embed).
    s.head_in.assign(rows * dim, -0.0f);
    for (size_t r = 0; r < rows; ++r) {
      const int64_t row = s.logit_rows[r];
      const parallel::SequenceChunk& chunk =
          s.sp_chunks[static_cast<size_t>(row / parallel::kSequenceChunkTokens)];
      const int64_t at = row - chunk.row, owner = at / chunk.piece;
      if (owner != layout_.tp_rank) continue;
      NormRows(s.x.data() + (chunk.shard_row + at - owner * chunk.piece) * dim,
               weights_.output_norm, config_.rms_eps, 1, dim, s.head_in.data() + r * dim, pool);
    }
    TESSERA_RETURN_IF_ERROR(tp->AllReduceSum(s.head_in, &weights_.output));
  } else if (s.cp.split) {
    TESSERA_RETURN_IF_ERROR(
        GatherContextHeadRows(config_, weights_.output_norm, s, pool, Context(tp)));
  } else {
    s.head_in.resize(rows * dim);
    for (size_t r = 0; r < rows; ++r) {
      NormRows(s.x.data() + static_cast<size_t>(s.logit_rows[r]) * dim, weights_.output_norm,
               config_.rms_eps, 1, dim, s.head_in.data() + r * dim, pool);
    }
  }
  logits.resize(rows * static_cast<size_t>(weights_.output.rows));
  Linear(weights_.output, s.head_in.data(), static_cast<int64_t>(rows), logits.data(), pool);
  return Status::Ok();
}

Status LlamaModel::Forward(const ForwardBatch& batch, const KvView& kv, LlamaScratch& s,
                           ThreadPool& pool, std::vector<float>& logits,
                           TensorParallelOps* tp) const {
  if (!layout_.first_stage || !layout_.last_stage) {
    return InvalidArgumentError("Forward needs every layer; this shard holds a pipeline stage");
  }
  TESSERA_RETURN_IF_ERROR(BeginStep(batch, kv, s));
  TESSERA_RETURN_IF_ERROR(Embed(batch, s, tp));
  TESSERA_RETURN_IF_ERROR(RunLayers(batch, kv, s, pool, tp));
  return Head(batch, s, pool, logits, tp);
}

}  // namespace tessera::model
