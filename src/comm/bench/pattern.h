// Deterministic test data for collectives: the value rank r contributes at global
// element g, and the exact expected reduction over N ranks. The values are small
// integers (products of ±1 and 2) so every reduction order gives the same bits in
// every dtype — a wrong result is a bug, never rounding. Layer: comm (shared by the
// benchmark's --check and the tests). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/types.h"

namespace tessera::comm {

// Writes `count` elements for global indices [first, first + count) of `rank`.
void FillPattern(void* buffer, size_t count, DataType dtype, ReduceOp op, int rank, size_t first);
// Writes the expected reduction over ranks 0..num_ranks-1 for the same indices.
void FillExpected(void* buffer, size_t count, DataType dtype, ReduceOp op, int num_ranks,
                  size_t first);
// Elements of `actual` that differ (bitwise) from `expected`.
size_t CountMismatches(const void* actual, const void* expected, size_t count, DataType dtype);

}  // namespace tessera::comm
