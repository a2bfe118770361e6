#include "parallel/context_shard.h"

#include <algorithm>

#include "base/check.h"

namespace tessera::parallel {

int ContextSpanOwner(int64_t span, int cp) {
  TESSERA_CHECK(cp >= 1 && span >= 0) << "span " << span << " over cp " << cp;
  const int64_t r = span % (2 * int64_t{cp});
  return static_cast<int>(r < cp ? r : 2 * int64_t{cp} - 1 - r);
}

int ContextBlockOwner(int64_t block, int64_t block_size, int64_t span, int cp) {
  TESSERA_CHECK(block_size >= 1 && span >= block_size && span % block_size == 0)
      << "blocks of " << block_size << " in spans of " << span;
  return ContextSpanOwner(block * block_size / span, cp);
}

int64_t ContextSpansOnRank(int64_t n_spans, int rank, int cp) {
  TESSERA_CHECK(cp >= 1 && rank >= 0 && rank < cp && n_spans >= 0)
      << "rank " << rank << " of cp " << cp << ", " << n_spans << " spans";
  const int64_t round = 2 * int64_t{cp};
  const int64_t rest = n_spans % round;
  // Each full round holds two of a rank's spans: at rank and at 2cp − 1 − rank.
  return n_spans / round * 2 + (rest > rank ? 1 : 0) + (rest > round - 1 - rank ? 1 : 0);
}

int64_t ContextMaxSpansOnRank(int64_t n_spans, int cp) {
  int64_t most = 0;
  for (int r = 0; r < cp; ++r) most = std::max(most, ContextSpansOnRank(n_spans, r, cp));
  return most;
}

}  // namespace tessera::parallel
