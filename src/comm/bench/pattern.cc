#include "comm/bench/pattern.h"

#include <cstring>

#include "base/half.h"

namespace tessera::comm {
namespace {

// A small integer in [-6, 6] for (rank, index); products use {2, 1, -1}.
int BaseValue(ReduceOp op, DataType dtype, int rank, size_t g) {
  int k = static_cast<int>((static_cast<uint64_t>(rank) * 131 + g * 31 + 7) % 13) - 6;
  if (op == ReduceOp::kProd) {
    int m = ((k % 3) + 3) % 3;
    return m == 0 ? 2 : (m == 1 ? 1 : -1);
  }
  if (dtype == DataType::kU8) return k + 6;
  return k;
}

void Store(void* buffer, size_t i, DataType dtype, double value) {
  switch (dtype) {
    case DataType::kF32: {
      float v = static_cast<float>(value);
      std::memcpy(static_cast<uint8_t*>(buffer) + i * 4, &v, 4);
      return;
    }
    case DataType::kF16: {
      uint16_t v = F32ToF16(static_cast<float>(value));
      std::memcpy(static_cast<uint8_t*>(buffer) + i * 2, &v, 2);
      return;
    }
    case DataType::kBf16: {
      uint16_t v = F32ToBf16(static_cast<float>(value));
      std::memcpy(static_cast<uint8_t*>(buffer) + i * 2, &v, 2);
      return;
    }
    case DataType::kI32: {
      int32_t v = static_cast<int32_t>(static_cast<int64_t>(value));
      std::memcpy(static_cast<uint8_t*>(buffer) + i * 4, &v, 4);
      return;
    }
    case DataType::kI64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(static_cast<uint8_t*>(buffer) + i * 8, &v, 8);
      return;
    }
    case DataType::kU8: {
      uint8_t v = static_cast<uint8_t>(static_cast<int64_t>(value) & 0xff);
      static_cast<uint8_t*>(buffer)[i] = v;
      return;
    }
  }
}

}  // namespace

void FillPattern(void* buffer, size_t count, DataType dtype, ReduceOp op, int rank, size_t first) {
  for (size_t i = 0; i < count; ++i) Store(buffer, i, dtype, BaseValue(op, dtype, rank, first + i));
}

void FillExpected(void* buffer, size_t count, DataType dtype, ReduceOp op, int num_ranks,
                  size_t first) {
  const bool is_float =
      dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16;
  for (size_t i = 0; i < count; ++i) {
    int64_t acc = BaseValue(op, dtype, 0, first + i);
    for (int r = 1; r < num_ranks; ++r) {
      int64_t v = BaseValue(op, dtype, r, first + i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc += v;
          break;
        case ReduceOp::kProd:
          acc *= v;
          break;
        case ReduceOp::kMin:
          acc = v < acc ? v : acc;
          break;
        case ReduceOp::kMax:
          acc = v > acc ? v : acc;
          break;
      }
    }
    if (op != ReduceOp::kAvg) {
      Store(buffer, i, dtype, static_cast<double>(acc));
      continue;
    }
    if (is_float) {
      // The implementations divide the (exact) f32 sum by N in f32, then round.
      float avg = static_cast<float>(acc) / static_cast<float>(num_ranks);
      Store(buffer, i, dtype, static_cast<double>(avg));
    } else if (dtype == DataType::kU8) {
      uint8_t wrapped = static_cast<uint8_t>(acc & 0xff);
      Store(buffer, i, dtype, wrapped / num_ranks);
    } else {
      Store(buffer, i, dtype, static_cast<double>(acc / num_ranks));
    }
  }
}

size_t CountMismatches(const void* actual, const void* expected, size_t count, DataType dtype) {
  const size_t esize = DataTypeSize(dtype);
  const uint8_t* a = static_cast<const uint8_t*>(actual);
  const uint8_t* e = static_cast<const uint8_t*>(expected);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * esize, e + i * esize, esize) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace tessera::comm
