// Context parallelism's split prefill (`--cp N`, issue 35). In a step whose
// sequences all start at position 0 — a whole prompt — each row runs on the cp
// rank that holds its span's KV (parallel::ContextSpanOwner, zig-zag over spans of
// the attention kernel), so the prompt's compute and its KV both divide over the
// group. A layer, on each rank: its rows' Q/K/V, their K/V kept in its cache; then
// the ring — cp steps; at step i the rank holds cp rank (rank − i)'s block of K/V
// rows, sends it on to the next rank while the previous one's arrives, stores it in
// a step-sized pool of the cache's layout, and attends with each run of its rows
// whose sequence's positions up to the run's end are all pooled by then (the first
// runs of a prompt while later blocks are still on the way). Every run attends once,
// over the same pool, with the kernel one rank uses (the same spans, the same fold:
// the same bits, whatever the order the runs complete in). The output projection and
// the FFN run on its rows alone. The head's rows are normalised by their owners and
// all-gathered, so every rank has the logits.
//
// Bytes a layer: cp − 1 ring steps of (most rows on one rank) × 2 × kv_dim values
// (f16 with an f16 cache, else f32) sent and as many received; the head, cp blocks of
// (logit rows) × dim floats all-gathered. Layer: model; LlamaModel calls it.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_weights.h"

namespace tessera::model {

// Fills s.cp for `batch` (every sequence starting at 0) on cp rank cp.rank: each
// row's owner and index there, this rank's rows as a batch of runs (s.cp.batch),
// and every sequence's table in a step-sized pool of `layout`'s blocks.
void SplitContextStep(const ForwardBatch& batch, const kernels::KvLayout& layout,
                      const ContextGroup& cp, ContextScratch& s);

// This rank's rows of x += attention(rmsnorm(x)), as the file comment says; the
// output projection all-reduced over `tp` (null: none) before the bias and the add.
Status AttentionBlockContextSplit(const ModelConfig& c, const kernels::RopeParams& rope,
                                  const LlamaLayerWeights& w, const ForwardBatch& batch,
                                  const KvView& kv, const KvLayerView& kv_layer,
                                  int64_t tile_tokens, LlamaScratch& s, ThreadPool& pool,
                                  TensorParallelOps* tp, const ContextGroup& cp);

// s.head_in = rmsnorm(x) · norm of each row in s.logit_rows (the step's row
// numbering), normalised by the rank that ran it and all-gathered.
Status GatherContextHeadRows(const ModelConfig& config, std::span<const float> norm,
                             LlamaScratch& s, ThreadPool& pool, const ContextGroup& cp);

}  // namespace tessera::model
