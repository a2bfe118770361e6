#include "parallel/sequence_shard.h"

#include <algorithm>

#include "base/check.h"

namespace tessera::parallel {

std::vector<SequenceChunk> SequenceChunks(int64_t num_tokens, int tp) {
  TESSERA_CHECK(tp >= 1 && num_tokens >= 0);
  std::vector<SequenceChunk> chunks;
  int64_t shard_row = 0;
  for (int64_t row = 0; row < num_tokens; row += kSequenceChunkTokens) {
    const int64_t n = std::min(kSequenceChunkTokens, num_tokens - row);
    const int64_t piece = (n + tp - 1) / tp;
    chunks.push_back({.row = row, .n = n, .piece = piece, .shard_row = shard_row});
    shard_row += piece;
  }
  return chunks;
}

int64_t SequenceShardRows(int64_t num_tokens, int tp) {
  int64_t rows = 0;
  for (const SequenceChunk& c : SequenceChunks(num_tokens, tp)) rows += c.piece;
  return rows;
}

}  // namespace tessera::parallel
