// Element-wise reduction kernels for the collectives: combine two buffers, divide
// for avg, and the canonical tree reduction of the deterministic all-reduce.
// Layer: comm; called by algorithms/. Pure functions on caller-owned memory.
#pragma once

#include <cstddef>
#include <span>

#include "comm/types.h"

namespace tessera::comm {

// acc[i] = op(acc[i], in[i]) for `count` elements. kAvg combines as a sum (divide
// once at the end with FinalizeAvg). f16/bf16 compute in f32 and round the result.
void ReduceInto(void* acc, const void* in, size_t count, DataType dtype, ReduceOp op);

// out[i] = op(a[i], b[i]); `out` may alias `a` or `b`.
void ReduceTwo(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// For kAvg: buf[i] /= num_ranks (f16/bf16 through f32; integers truncate toward
// zero). No-op for the other ops.
void FinalizeAvg(void* buf, size_t count, DataType dtype, ReduceOp op, int num_ranks);

// The canonical balanced binary tree over rank index (the deterministic
// all-reduce's contract): out[i] = Tree(0, n) where Tree(lo, hi) = inputs[lo][i]
// if hi - lo == 1, else Tree(lo, mid) op Tree(mid, hi) with mid = lo + (hi - lo) / 2.
// f16/bf16 accumulate in f32 through the whole tree and round once at the end;
// kAvg divides the tree sum by n before that single rounding. `out` may alias
// any input.
void TreeReduce(std::span<const void* const> inputs, void* out, size_t count, DataType dtype,
                ReduceOp op);

}  // namespace tessera::comm
