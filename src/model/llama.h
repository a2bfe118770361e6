// LlamaModel: the forward pass of llama-family models (llama 2/3, mistral, qwen2;
// dense, Mixtral-style MoE and qwen2moe) over a batch of sequences, each bringing
// some new tokens (a prefill chunk or one decode token) and attending to its own
// paged KV cache. Layer: model; the engine's StageRunner drives it step by step.
//
// Batch invariance: every operation computes a token's row from that row alone
// (the kernels fix the reduction order per output element), so a sequence's
// logits are bit-identical whatever else is in the batch and however its prompt
// is chunked. Forward is const and re-entrant given separate scratch; it runs
// its kernels on the caller's thread pool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/context_attention.h"
#include "model/gguf.h"
#include "model/llama_weights.h"
#include "model/shard.h"
#include "parallel/sequence_shard.h"

namespace tessera::model {

// Where one layer's paged KV cache lives (storage is owned by kv::KvCache): K and V
// pools of [num_blocks, num_kv_heads, block_size, head_dim], as kernels/attention.h
// lays them out.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
};

struct KvView {
  std::span<const KvLayerView> layers;  // [num_layers]
  kernels::KvLayout layout;
  int64_t num_blocks = 0;  // physical blocks per pool, for bounds checks
};

// One sequence's part of a step.
struct ForwardSequence {
  int64_t num_tokens = 0;      // new tokens this step (>= 1)
  int64_t start_position = 0;  // tokens already cached = position of the first new token
  // KV blocks covering positions [0, start_position + num_tokens), in order.
  std::span<const int32_t> block_table;
  bool all_logits = false;  // logits of every new token, not just the last one
};

struct ForwardBatch {
  std::span<const int32_t> tokens;             // [total new tokens], sequence after sequence
  std::span<const ForwardSequence> sequences;  // their sum of num_tokens = tokens.size()
  // false: logits of each sequence's last new token, or of all its new tokens
  // when its ForwardSequence::all_logits, in order; true: logits of every new
  // token ([tokens.size(), vocab]).
  bool all_logits = false;
  // Sequence parallelism (tp > 1, dense models): each tp rank's residual stream
  // holds its pieces of the step's rows (parallel/sequence_shard.h); the bits are
  // the same as without.
  bool sequence_parallel = false;
  // Called after each layer's attention (global layer index, in order), once that
  // layer's K/V of the step's new tokens is in the cache: KV streaming between
  // instances sends it while the step's later layers compute (docs/pd.md).
  // An error fails the step.
  const std::function<Status(int64_t layer)>* on_layer_kv = nullptr;
};

// One sequence's new tokens inside a tile of a step's rows: rows [row, row + n) of
// the step are its new tokens [first, first + n).
struct TileSegment {
  size_t sequence = 0;
  int64_t first = 0;
  int64_t row = 0;
  int64_t n = 0;
};

// Context parallelism's part of a step (context_blocks.h). A split step runs each
// row on the cp rank holding its span's KV: this rank's rows form `batch`, runs of
// consecutive positions of the step's sequences.
struct ContextScratch {
  bool split = false;
  std::vector<int32_t> row_owner;          // [T] the cp rank running each row of the step
  std::vector<int32_t> row_local;          // [T] its index among that rank's rows
  std::vector<int64_t> rows_on_rank;       // [cp]
  std::vector<int32_t> tokens;             // this rank's rows' tokens
  std::vector<ForwardSequence> sequences;  // their runs, in row order
  std::vector<int32_t> run_sequence;       // [runs] the step's sequence each run belongs to
  // [runs] the ring step (context_blocks.h) by which every position of its sequence
  // up to the run's end is in this rank's step pools.
  std::vector<int32_t> run_ring_step;
  std::vector<int64_t> run_rows;  // [runs + 1] each run's first row among this rank's
  ForwardBatch batch;             // tokens and sequences: this rank's share
  std::vector<float> q, attn;     // [this rank's rows, q_dim]
  // [cp] blocks of K rows then V rows, all-gathered (f32; an f16 cache: this rank's
  // f32 rows only, and kv_f16 is what goes round).
  std::vector<float> kv;
  std::vector<float> kv_f16;            // [cp] the same blocks as f16 pairs (KvHeadToF16 per head)
  std::vector<uint8_t> pool_k, pool_v;  // one layer's K/V of every row of the step
  std::vector<int32_t> tables;          // each sequence's blocks in those pools, in turn
  std::vector<size_t> table_offset;     // [sequences + 1] into tables
  std::vector<ContextQuery> queries;    // an unsplit step's queries of one tile
  std::vector<float> partials;          // their span partials, all-gathered
};

// Activations of one step; grows to the largest batch seen and is reused.
// The blocks run a step's tokens a tile at a time (llama_blocks.cc): only the
// residual stream x holds every token; under tensor parallelism proj does too.
struct LlamaScratch {
  std::vector<float> x;     // [T, dim] residual stream
  std::vector<float> h;     // [tile, dim] normalised input of a block ([T, dim] for MoE)
  std::vector<float> q;     // [tile, num_heads * head_dim]
  std::vector<float> k;     // [tile, num_kv_heads * head_dim]
  std::vector<float> v;     // [tile, num_kv_heads * head_dim]
  std::vector<float> attn;  // [tile, num_heads * head_dim]
  std::vector<float> proj;  // [tile or T, dim] output of wo / ffn_down
  std::vector<float> gate;  // [tile, ffn] (dense) or [rows routed to an expert, ffn] (MoE)
  std::vector<float> up;    // same shape as gate
  // MoE (moe.cc).
  std::vector<float> router_logits;    // [T, num_experts]
  std::vector<int32_t> expert_choice;  // [T, experts_used] chosen expert ids, best first
  std::vector<float> expert_weight;    // [T, experts_used] their mixing weights
  std::vector<int32_t> expert_rows;    // one expert's group: t * experts_used + k
  std::vector<float> expert_in;        // [rows routed to one expert, dim]
  std::vector<float> expert_out;       // [T * experts_used, dim] each (token, choice)'s output
  std::vector<float> shared_gate;      // [T] qwen2moe shared-expert gate logits
  // Expert parallelism (moe_ep.cc, moe_dp.cc).
  std::vector<int32_t> ep_send_order;  // (token, choice) indices, grouped by destination rank
  std::vector<int32_t> ep_assign;      // the EP rank computing each of the group's rows
  std::vector<float> ep_send;          // [rows sent, dim] dispatched inputs / returned outputs
  std::vector<float> ep_recv;          // [rows received, dim]
  std::vector<size_t> ep_rows_to, ep_rows_from;  // [ep] rows this layer
  // Data-parallel attention (moe_dp.cc): rows of each expert to / from each dp rank.
  std::vector<int64_t> ep_counts_to, ep_counts_from;  // [ep, num_experts]
  // Load statistics of the step: (token, choice) rows routed to each expert,
  // summed over this rank's layers ([num_experts]; under EP over the tokens of its
  // EP group, whose expert owners run exactly these), and the rows this rank's
  // combines sent to / received from other EP ranks.
  std::vector<int64_t> expert_rows_step;
  // Expert parallelism: the same for each layer of the stage ([layers, num_experts]),
  // what per-layer expert placement balances.
  std::vector<int64_t> expert_rows_layer_step;
  int64_t ep_rows_sent_step = 0;
  int64_t expert_rows_computed_step = 0;  // (token, choice) rows this rank's experts ran
  int64_t ep_rows_received_step = 0;
  std::vector<TileSegment> tile_segments;  // the sequences' parts of one tile
  std::vector<int32_t> logit_rows;         // rows of x whose logits are wanted
  std::vector<float> head_in;              // [rows, dim] final-normed rows for the output head
  // Sequence parallelism: the step's chunks (x then holds this rank's pieces, chunk
  // after chunk), and one chunk's reduce-scattered piece.
  std::vector<parallel::SequenceChunk> sp_chunks;
  std::vector<float> sp_piece;
  ContextScratch cp;

  // Bytes the buffers hold (they keep the largest step's size).
  int64_t CapacityBytes() const;
};

// The tensor-parallel group's collective, as the forward pass needs it. Under
// tp > 1 each row-parallel product (attention output, FFN output) and the vocab-
// sharded embedding is a partial sum that this completes. parallel/ implements it
// over comm; with a whole model there is none (null).
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  // Sums `data` element-wise over the group, in place. For bit-identical results
  // the sum must be the canonical balanced tree over tp ranks (comm's
  // deterministic all-reduce), the same tree kernels::MatMul uses over K chunks.
  // `next` (may be null) is the matrix the forward pass multiplies `data`'s
  // tokens by next, which the wait may warm into the cache.
  virtual Status AllReduceSum(std::span<float> data, const WeightMatrix* next) = 0;
  // Sequence parallelism: `full` holds tp equal blocks of partial sums; `piece`
  // (one block) gets block tp rank summed over the group with the same tree as
  // AllReduceSum, so the bits equal that block of its result.
  virtual Status ReduceScatterSum(std::span<const float> full, std::span<float> piece);

  // Expert parallelism (moe_ep.h); only a runner with ep > 1 implements these.
  // MPI_Alltoallv over the EP group on rows of `row_floats` floats: rows_to[p]
  // rows go to EP rank p (packed in peer order in `send`), rows_from[p] arrive
  // from it (packed in peer order in `recv`). Nothing moves for a zero count.
  virtual Status ExpertAllToAllv(std::span<const float> send, std::span<const size_t> rows_to,
                                 std::span<float> recv, std::span<const size_t> rows_from,
                                 int64_t row_floats);
  // Data-parallel attention (moe_dp.h): MPI_Alltoall of int64 counts over the EP
  // group, send.size() / ep to each rank (block p of `send` to rank p, of `recv`
  // from it).
  virtual Status ExpertAllToAllCounts(std::span<const int64_t> send, std::span<int64_t> recv);
  // All-gather over the tp group of equal blocks of `block` floats: `data` holds
  // tp blocks, this rank's at tp rank × block; the others are filled in (expert
  // parallelism's token split, sequence parallelism's chunks).
  virtual Status AllGatherBlocks(std::span<float> data, size_t block);
  // Context parallelism (cp > 1): the same over the context-parallel group (this
  // rank's block at cp rank × block).
  virtual Status ContextAllGatherBlocks(std::span<float> data, size_t block);
  // Context parallelism's ring (context_blocks.h): starts sending `send` to the next
  // cp rank and receiving `recv` (exactly its size) from the previous one;
  // ContextRingWait finishes both. One ring step in flight at a time;
  // ContextRingProgress moves it on without waiting (the transports have no
  // progress thread: a step advances while its ranks call in).
  virtual Status ContextRingStart(std::span<const float> send, std::span<float> recv);
  virtual Status ContextRingProgress();
  virtual Status ContextRingWait();
};

// The context-parallel group as the blocks see it: this rank's place and its
// all-gather (size 1: no group).
struct ContextGroup {
  int rank = 0;
  int size = 1;
  TensorParallelOps* ops = nullptr;
};

class LlamaModel {
 public:
  // Reads the config, validates and binds the weights of `shard` (default: all of
  // them). `file` must outlive the model. An invalid shard is InvalidArgument
  // before any weight is touched.
  static Result<LlamaModel> Load(const GgufFile& file, const ModelShard& shard = {});

  const ModelConfig& config() const { return config_; }  // the whole model's
  // This rank's dims: its layers, heads, KV heads and FFN rows (= config() when whole).
  const ModelConfig& local_config() const { return local_; }
  const ShardLayout& layout() const { return layout_; }
  const LlamaWeights& weights() const { return weights_; }
  // Expert parallelism: from now on hold the experts `placement` gives this rank
  // (RebindExperts: only the experts that change move); run between steps, on
  // every rank of the EP group alike. InvalidArgument, with nothing changed, for a
  // placement CheckExpertPlacement refuses against this rank's slots;
  // InvalidArgument too without expert parallelism.
  Status SetExpertPlacement(const GgufFile& file, const parallel::ExpertPlacement& placement);
  // Tokens per pass through a block, from the shard's shape and weight bytes
  // (BlockTileTokens in llama_blocks.h); the bits do not depend on it.
  int64_t tile_tokens() const { return tile_tokens_; }

  // Runs one step on a whole model (tp = 1 or `tp` given, one stage): appends each
  // new token's K/V to the cache at its position and writes the requested logits
  // (see ForwardBatch::all_logits) to `logits` ([rows, vocab rows held], resized).
  // Inputs are checked (token ids, positions, block tables); a bad batch is
  // InvalidArgument and leaves the cache untouched.
  Status Forward(const ForwardBatch& batch, const KvView& kv, LlamaScratch& scratch,
                 ThreadPool& pool, std::vector<float>& logits,
                 TensorParallelOps* tp = nullptr) const;

  // The pieces of Forward, for pipeline stages. Each works on scratch.x, the
  // residual stream of the step's tokens ([T, dim]).
  // Validates the batch against this shard's KV cache and sizes the scratch.
  Status BeginStep(const ForwardBatch& batch, const KvView& kv, LlamaScratch& scratch) const;
  // First stage: x = the tokens' embedding rows (summed over the vocab shards).
  Status Embed(const ForwardBatch& batch, LlamaScratch& scratch, TensorParallelOps* tp) const;
  // This stage's layers, x in place.
  Status RunLayers(const ForwardBatch& batch, const KvView& kv, LlamaScratch& scratch,
                   ThreadPool& pool, TensorParallelOps* tp) const;
  // Last stage: final norm and this rank's vocab rows of the head, for the rows
  // ForwardBatch::all_logits selects: logits [rows, layout().vocab.size()]. Under
  // sequence parallelism each rank normalises the rows it holds and one all-reduce
  // (the others' rows -0.0) hands every rank all of them.
  Status Head(const ForwardBatch& batch, LlamaScratch& scratch, ThreadPool& pool,
              std::vector<float>& logits, TensorParallelOps* tp) const;
  // Whether this step runs sequence parallel on this shard (the batch asks and tp > 1).
  bool SequenceParallel(const ForwardBatch& batch) const {
    return batch.sequence_parallel && layout_.tp_size > 1;
  }
  // Whether this step runs split over the context-parallel group: cp > 1 and every
  // sequence starts at position 0 (a whole prompt's prefill), so each row runs on
  // the rank holding its span (context_blocks.h). Other steps run every row on
  // every cp rank, attention over the distributed KV (ContextParallelAttention).
  bool ContextSplit(const ForwardBatch& batch) const;
  // Bytes of the residual stream a stage receives and sends for this step, after
  // BeginStep: every row, or this rank's pieces under sequence parallelism, or its
  // rows of a split context-parallel step.
  size_t ActivationBytes(const ForwardBatch& batch, const LlamaScratch& scratch) const;

 private:
  LlamaModel(ModelConfig config, ShardLayout layout, LlamaWeights weights);
  Status CheckBatch(const ForwardBatch& batch, const KvView& kv) const;
  // ForwardBatch::on_layer_kv, if any, for this shard's layer `local_layer`.
  Status LayerKvDone(const ForwardBatch& batch, int64_t local_layer) const;
  // The context-parallel group over `ops` (its size 1 without cp).
  ContextGroup Context(TensorParallelOps* ops) const;

  ModelConfig config_;  // the whole model
  ShardLayout layout_;
  ModelConfig local_;  // layout_.LocalConfig(config_)
  LlamaWeights weights_;
  kernels::RopeParams rope_;  // from config_
  int64_t tile_tokens_;       // tokens per pass through a block (BlockTileTokens)
};

}  // namespace tessera::model
