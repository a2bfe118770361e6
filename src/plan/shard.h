// How much of the model one rank holds and computes under a Parallelism: heads,
// KV heads, FFN columns, vocab rows, tokens. Layer: plan (pure arithmetic), shared
// by the traffic, memory and time models so they agree on every shard size.
#pragma once

#include <algorithm>
#include <cstdint>

#include "plan/collectives.h"
#include "plan/layout.h"
#include "plan/model_shape.h"

namespace tessera::plan {

inline int64_t HeadsPerRank(const ModelShape& m, const Parallelism& p) {
  return m.num_heads / p.tp;
}

// KV heads are split by tp, or replicated (one per rank) when tp exceeds them.
inline int64_t KvHeadsPerRank(const ModelShape& m, const Parallelism& p) {
  return p.tp <= m.num_kv_heads ? m.num_kv_heads / p.tp : 1;
}

// KV elements one rank caches per token per layer (the MLA latent is not split).
inline int64_t KvElemsPerTokenLayerPerRank(const ModelShape& m, const Parallelism& p) {
  if (m.kv_latent_dim > 0) return m.kv_latent_dim;
  return 2 * KvHeadsPerRank(m, p) * m.head_dim;
}

// Vocab rows of tp rank `tp_rank` (vocab-parallel embedding and output head).
inline int64_t VocabRowsOfRank(const ModelShape& m, const Parallelism& p, int64_t tp_rank) {
  return ChunkElems(m.vocab_size, p.tp, tp_rank);
}

// Context parallelism as the engine runs it (model/context_blocks.h): a sequence's
// positions fall into spans of the attention kernel's (kernels::kAttentionSpan;
// tests/plan holds the two equal), span k on cp rank CpSpanOwner(k) — zig-zag, ranks
// 0..cp-1 then cp-1..0 in each round of 2cp spans (parallel::ContextSpanOwner).
inline constexpr int64_t kCpSpanTokens = 256;

inline int64_t CpSpanOwner(int64_t span, int64_t cp) {
  const int64_t r = span % (2 * cp);
  return r < cp ? r : 2 * cp - 1 - r;
}

// Spans of [0, n_spans) cp rank `cp_rank` holds.
inline int64_t CpSpansOnRank(int64_t n_spans, int64_t cp, int64_t cp_rank) {
  int64_t held = 0;
  for (int64_t k = 0; k < n_spans; ++k) held += CpSpanOwner(k, cp) == cp_rank ? 1 : 0;
  return held;
}

// Tokens a cp rank runs: a whole prompt's prefill splits its positions by span
// owner; a decode step's new token runs on every cp rank.
inline int64_t TokensOnCpRank(int64_t num_seqs, int64_t tokens_per_seq, bool prefill,
                              const Parallelism& p, int64_t cp_rank) {
  if (!prefill || p.cp == 1) return num_seqs * tokens_per_seq;
  int64_t tokens = 0;
  for (int64_t k = 0; k * kCpSpanTokens < tokens_per_seq; ++k) {
    if (CpSpanOwner(k, p.cp) == cp_rank) {
      tokens += std::min(kCpSpanTokens, tokens_per_seq - k * kCpSpanTokens);
    }
  }
  return num_seqs * tokens;
}

}  // namespace tessera::plan
