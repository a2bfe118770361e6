// Sequence parallelism's split of a step's tokens over a stage's tp ranks
// (Megatron SP, `--sp`): the step's rows are cut into chunks of
// kSequenceChunkTokens, and each chunk into tp pieces of ⌈n/tp⌉ rows, piece r
// on tp rank r (the last pieces short or empty, padded). A rank's residual
// stream holds its pieces, chunk after chunk; the blocks all-gather a chunk's
// normalised pieces before the column-parallel products and reduce-scatter the
// row-parallel partial sums back into pieces. Pure arithmetic, the same on every
// rank and stage (plan/traffic.cc repeats it to predict the bytes). Layer: parallel.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::parallel {

// Rows a chunk spans: the blocks' tile under SP, and the unit of its collectives.
inline constexpr int64_t kSequenceChunkTokens = 256;

struct SequenceChunk {
  int64_t row = 0;  // the chunk is the step's rows [row, row + n)
  int64_t n = 0;
  int64_t piece = 0;      // ⌈n / tp⌉ rows each rank holds (padded)
  int64_t shard_row = 0;  // where this chunk's piece starts in a rank's shard
  // This rank's real rows of the chunk: [row + first, row + first + count).
  int64_t FirstOf(int tp_rank) const { return tp_rank * piece; }
  int64_t CountOf(int tp_rank) const {
    const int64_t left = n - tp_rank * piece;
    return left <= 0 ? 0 : (left < piece ? left : piece);
  }
};

// The chunks of a step of `num_tokens` rows over `tp` ranks.
std::vector<SequenceChunk> SequenceChunks(int64_t num_tokens, int tp);

// Rows of a rank's shard (padding included): the sum of the chunks' pieces.
int64_t SequenceShardRows(int64_t num_tokens, int tp);

}  // namespace tessera::parallel
