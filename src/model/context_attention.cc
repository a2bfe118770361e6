#include "model/context_attention.h"

#include <algorithm>
#include <string>

#include "base/check.h"
#include "parallel/context_shard.h"

namespace tessera::model {
namespace {

int64_t SpansOf(const kernels::KvLayout& layout, const ContextQuery& query) {
  return query.pos / layout.span + 1;
}

// A rank's slot of a query in a block: `slots` span partials, laid out as
// SpanPartials wants a run of them — every span's weighted sums, then every span's
// maxima, then every span's sums — so the i-th span a rank holds is entry i of each.
struct Slot {
  float* base;
  int64_t slots;
  int64_t n_heads;
  int64_t head_dim;

  float* Out(int64_t i) const { return base + i * n_heads * head_dim; }
  float* Max(int64_t i) const { return base + slots * n_heads * head_dim + i * n_heads; }
  float* Sum(int64_t i) const { return Max(slots) + i * n_heads; }
};

int64_t SlotFloats(int64_t slots, int64_t n_heads, int64_t head_dim) {
  return slots * n_heads * (head_dim + 2);
}

}  // namespace

size_t ContextAttentionBlockFloats(const kernels::KvLayout& layout,
                                   std::span<const ContextQuery> queries, int64_t n_heads, int cp) {
  size_t floats = 0;
  for (const ContextQuery& query : queries) {
    const int64_t slots = parallel::ContextMaxSpansOnRank(SpansOf(layout, query), cp);
    floats += static_cast<size_t>(SlotFloats(slots, n_heads, layout.head_dim));
  }
  return floats;
}

Status ContextParallelAttention(const kernels::PagedKv& kv, std::span<const ContextQuery> queries,
                                int64_t n_heads, int cp_rank, int cp,
                                const ContextAllGather& all_gather, std::vector<float>& buffer,
                                ThreadPool* pool) {
  const kernels::KvLayout& layout = kv.layout;
  if (layout.span % layout.block_size != 0) {
    return InvalidArgumentError(
        "context parallelism needs whole KV blocks per attention span: span " +
        std::to_string(layout.span) + ", block size " + std::to_string(layout.block_size));
  }
  TESSERA_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp) << "cp rank " << cp_rank << " of " << cp;
  const int64_t head_dim = layout.head_dim;
  const size_t block = ContextAttentionBlockFloats(layout, queries, n_heads, cp);
  buffer.assign(block * static_cast<size_t>(cp), 0.0f);

  // This rank's spans of every query: runs of consecutive spans it holds, each one
  // call of the kernel, into its block.
  float* mine = buffer.data() + static_cast<size_t>(cp_rank) * block;
  std::vector<int64_t> slot_offsets;
  slot_offsets.reserve(queries.size());
  int64_t offset = 0;
  for (const ContextQuery& query : queries) {
    const int64_t n_spans = SpansOf(layout, query);
    const int64_t slots = parallel::ContextMaxSpansOnRank(n_spans, cp);
    slot_offsets.push_back(offset);
    const Slot slot{mine + offset, slots, n_heads, head_dim};
    int64_t held = 0;
    for (int64_t k = 0; k < n_spans;) {
      if (parallel::ContextSpanOwner(k, cp) != cp_rank) {
        ++k;
        continue;
      }
      int64_t end = k + 1;
      while (end < n_spans && parallel::ContextSpanOwner(end, cp) == cp_rank) ++end;
      const kernels::SpanPartials run{.first_span = k,
                                      .n_spans = end - k,
                                      .n_heads = n_heads,
                                      .out = slot.Out(held),
                                      .max = slot.Max(held),
                                      .sum = slot.Sum(held)};
      kernels::AttentionSpanPartials(kv, query.block_table, query.q, n_heads, query.pos, run, pool);
      held += end - k;
      k = end;
    }
    offset += SlotFloats(slots, n_heads, head_dim);
  }

  if (cp > 1) TESSERA_RETURN_IF_ERROR(all_gather(std::span<float>(buffer), block));

  // Every query's spans in span order, from whichever rank held each, then the fold.
  std::vector<float> out, max, sum;
  std::vector<int64_t> held(static_cast<size_t>(cp));
  for (size_t i = 0; i < queries.size(); ++i) {
    const ContextQuery& query = queries[i];
    const int64_t n_spans = SpansOf(layout, query);
    const int64_t slots = parallel::ContextMaxSpansOnRank(n_spans, cp);
    const int64_t row = n_heads * head_dim;
    out.resize(static_cast<size_t>(n_spans * row));
    max.resize(static_cast<size_t>(n_spans * n_heads));
    sum.resize(static_cast<size_t>(n_spans * n_heads));
    std::fill(held.begin(), held.end(), 0);
    for (int64_t k = 0; k < n_spans; ++k) {
      const int r = parallel::ContextSpanOwner(k, cp);
      const Slot slot{buffer.data() + static_cast<size_t>(r) * block + slot_offsets[i], slots,
                      n_heads, head_dim};
      const int64_t j = held[static_cast<size_t>(r)]++;
      std::copy_n(slot.Out(j), row, out.data() + k * row);
      std::copy_n(slot.Max(j), n_heads, max.data() + k * n_heads);
      std::copy_n(slot.Sum(j), n_heads, sum.data() + k * n_heads);
    }
    kernels::FoldAttentionPartials(
        kernels::SpanPartials{0, n_spans, n_heads, out.data(), max.data(), sum.data()}, n_heads,
        head_dim, query.out);
  }
  return Status::Ok();
}

}  // namespace tessera::model
