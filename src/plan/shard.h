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

// Tokens a cp rank holds: a prefill's sequence is split into cp chunks (first ones
// longer); a decode step's new token is processed on every cp rank.
inline int64_t TokensOnCpRank(int64_t num_seqs, int64_t tokens_per_seq, bool prefill,
                              const Parallelism& p, int64_t cp_rank) {
  if (!prefill || p.cp == 1) return num_seqs * tokens_per_seq;
  return num_seqs * ChunkElems(tokens_per_seq, p.cp, cp_rank);
}

}  // namespace tessera::plan
