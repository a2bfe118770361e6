// Context parallelism's split of a sequence's KV cache (`--cp N`, issue 35): the
// positions fall into spans of the attention kernel's span (kernels/attention.h,
// kAttentionSpan), and span k lives on one cp rank, assigned zig-zag — in each
// round of 2N spans, ranks 0, 1, …, N−1 then N−1, …, 1, 0 — so every rank holds
// about as many early (cheap under a causal mask) as late spans. Pure arithmetic,
// the same on every rank. Layer: parallel.
#pragma once

#include <cstdint>

namespace tessera::parallel {

// The cp rank holding span k.
int ContextSpanOwner(int64_t span, int cp);

// The cp rank holding the KV block at index `block` of a sequence's block table
// (blocks of `block_size` positions, spans of `span`; a span is whole blocks).
int ContextBlockOwner(int64_t block, int64_t block_size, int64_t span, int cp);

// How many of spans [0, n_spans) cp rank `rank` holds.
int64_t ContextSpansOnRank(int64_t n_spans, int rank, int cp);

// The most spans of [0, n_spans) any one rank holds: the size of every rank's slot
// in the decode's all-gather.
int64_t ContextMaxSpansOnRank(int64_t n_spans, int cp);

}  // namespace tessera::parallel
