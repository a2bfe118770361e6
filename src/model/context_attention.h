// Context parallelism's decode attention over a KV cache spread over the cp group
// (`--cp N`, issue 35): span k of every sequence's KV lives on cp rank
// parallel::ContextSpanOwner(k), so a long context's KV takes 1/cp of each rank's
// pool. The layers before attention are replicated in the group, so every rank has
// the step's queries; each computes the partials of the spans it holds
// (kernels::AttentionSpanPartials), one all-gather over the group exchanges them,
// and every rank folds a query's spans in span order (kernels::FoldAttentionPartials)
// — the fold one rank's kernel does over its own spans. Every rank's output is then
// kernels::Attention's bits over the whole sequence, whatever cp: the span is the
// kernel's, not the group's.
//
// Bytes: one all-gather a layer a step, of cp equal blocks; a query of n spans
// takes ContextMaxSpansOnRank(n, cp) · n_heads · (head_dim + 2) floats of each
// block, however long its spans' KV (ContextAttentionBlockFloats).
// Layer: model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"

namespace tessera::model {

// One decode query of a sequence, at position pos: it attends to [0, pos], whose
// K/V this rank holds only for its own spans (its own position included, when that
// span is this rank's). Table entries of the other spans' blocks are never read.
struct ContextQuery {
  std::span<const int32_t> block_table;
  const float* q = nullptr;  // [n_heads, head_dim]
  int64_t pos = 0;
  float* out = nullptr;  // [n_heads, head_dim], written on every rank
};

// The group's all-gather of equal blocks of `block` floats: `data` holds cp blocks,
// this rank's at rank × block; the others are filled in.
using ContextAllGather = std::function<Status(std::span<float> data, size_t block)>;

// Floats of one rank's block for `queries` (the same on every rank).
size_t ContextAttentionBlockFloats(const kernels::KvLayout& layout,
                                   std::span<const ContextQuery> queries, int64_t n_heads, int cp);

// The queries' attention, identical on every rank of the group. `buffer` is
// scratch (cp blocks). InvalidArgument where a KV block would straddle two spans
// (the layout's span must be a multiple of its block size); the all-gather's error
// otherwise.
Status ContextParallelAttention(const kernels::PagedKv& kv, std::span<const ContextQuery> queries,
                                int64_t n_heads, int cp_rank, int cp,
                                const ContextAllGather& all_gather, std::vector<float>& buffer,
                                ThreadPool* pool = nullptr);

}  // namespace tessera::model
