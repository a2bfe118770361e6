#include "comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/half.h"
#include "base/target_clones.h"

namespace tessera::comm {
namespace {

template <typename T>
struct SumOp {
  static T Apply(T a, T b) { return a + b; }
};
template <typename T>
struct ProdOp {
  static T Apply(T a, T b) { return a * b; }
};
template <typename T>
struct MinOp {
  static T Apply(T a, T b) { return b < a ? b : a; }
};
template <typename T>
struct MaxOp {
  static T Apply(T a, T b) { return a < b ? b : a; }
};

// Integer sums and products wrap (two's complement) instead of overflowing.
template <>
struct SumOp<int32_t> {
  static int32_t Apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
template <>
struct SumOp<int64_t> {
  static int64_t Apply(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};
template <>
struct ProdOp<int32_t> {
  static int32_t Apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
  }
};
template <>
struct ProdOp<int64_t> {
  static int64_t Apply(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  }
};
template <>
struct SumOp<uint8_t> {
  static uint8_t Apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>(a + b); }
};
template <>
struct ProdOp<uint8_t> {
  static uint8_t Apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>(a * b); }
};

// The hot loops: plain element-wise loops the compiler vectorises, cloned for AVX2
// with a run-time dispatch (no global -march). Clang (the fuzz build) does not
// clone templates; there the loop is built for the baseline only.
#if defined(__clang__)
#define TESSERA_CLONE_AVX2
#else
#define TESSERA_CLONE_AVX2 TESSERA_TARGET_CLONES("avx2", "default")
#endif
template <typename T, typename Op>
TESSERA_CLONE_AVX2 void Loop2(T* __restrict out, const T* a, const T* b, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = Op::Apply(a[i], b[i]);
}

template <typename T>
void DispatchNative(void* out, const void* a, const void* b, size_t count, ReduceOp op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Loop2<T, SumOp<T>>(o, x, y, count);
    case ReduceOp::kProd:
      return Loop2<T, ProdOp<T>>(o, x, y, count);
    case ReduceOp::kMin:
      return Loop2<T, MinOp<T>>(o, x, y, count);
    case ReduceOp::kMax:
      return Loop2<T, MaxOp<T>>(o, x, y, count);
  }
}

// f16/bf16 <-> f32 over short blocks (f16: base/half.h's F16C rows).
void HalfToF32(const uint16_t* in, float* out, size_t n, DataType dtype) {
  if (dtype == DataType::kF16) {
    F16ToF32Row(in, out, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
  }
}

TESSERA_TARGET_CLONES("avx2", "default")
void F32ToBf16Loop(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

void F32ToHalf(const float* in, uint16_t* out, size_t n, DataType dtype) {
  if (dtype == DataType::kF16) {
    F32ToF16Row(in, out, n);
  } else {
    F32ToBf16Loop(in, out, n);
  }
}

constexpr size_t kBlock = 1024;  // elements per f32 staging block (stays in L1)

void ReduceHalf(void* out, const void* a, const void* b, size_t count, DataType dtype,
                ReduceOp op) {
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t start = 0; start < count; start += kBlock) {
    size_t n = std::min(kBlock, count - start);
    HalfToF32(x + start, fa, n, dtype);
    HalfToF32(y + start, fb, n, dtype);
    DispatchNative<float>(fa, fa, fb, n, op);
    F32ToHalf(fa, o + start, n, dtype);
  }
}

bool IsHalf(DataType dtype) { return dtype == DataType::kF16 || dtype == DataType::kBf16; }

// Computes Tree(lo, hi) for one block of `n` elements into `out` (compute type C).
// `load(r, dst)` writes rank r's block into dst; scratch holds one block per depth.
template <typename C, typename Load>
void TreeBlock(int lo, int hi, C* out, size_t n, ReduceOp op, const Load& load,
               std::vector<C>& scratch, int depth) {
  if (hi - lo == 1) {
    load(lo, out);
    return;
  }
  int mid = lo + (hi - lo) / 2;
  TreeBlock<C>(lo, mid, out, n, op, load, scratch, depth + 1);
  C* right = scratch.data() + static_cast<size_t>(depth) * kBlock;
  TreeBlock<C>(mid, hi, right, n, op, load, scratch, depth + 1);
  DispatchNative<C>(out, out, right, n, op);
}

int TreeDepth(int n) {
  int depth = 0;
  while ((1 << depth) < n) ++depth;
  return depth + 1;
}

template <typename T>
void TreeReduceNative(std::span<const void* const> inputs, void* out, size_t count, ReduceOp op) {
  const int n = static_cast<int>(inputs.size());
  thread_local std::vector<T> scratch;
  scratch.resize(static_cast<size_t>(TreeDepth(n)) * kBlock);
  alignas(64) T block[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    size_t len = std::min(kBlock, count - start);
    auto load = [&](int r, T* dst) {
      std::memcpy(dst, static_cast<const T*>(inputs[r]) + start, len * sizeof(T));
    };
    TreeBlock<T>(0, n, block, len, op, load, scratch, 0);
    std::memcpy(static_cast<T*>(out) + start, block, len * sizeof(T));
  }
}

void TreeReduceHalf(std::span<const void* const> inputs, void* out, size_t count, DataType dtype,
                    ReduceOp op) {
  const int n = static_cast<int>(inputs.size());
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(TreeDepth(n)) * kBlock);
  alignas(64) float block[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    size_t len = std::min(kBlock, count - start);
    auto load = [&](int r, float* dst) {
      HalfToF32(static_cast<const uint16_t*>(inputs[r]) + start, dst, len, dtype);
    };
    TreeBlock<float>(0, n, block, len, op, load, scratch, 0);
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < len; ++i) block[i] /= static_cast<float>(n);
    }
    F32ToHalf(block, static_cast<uint16_t*>(out) + start, len, dtype);
  }
}

template <typename T>
void DivideBy(void* buf, size_t count, int n) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(n));
}

}  // namespace

void ReduceTwo(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (dtype) {
    case DataType::kF32:
      return DispatchNative<float>(out, a, b, count, op);
    case DataType::kF16:
    case DataType::kBf16:
      return ReduceHalf(out, a, b, count, dtype, op);
    case DataType::kI32:
      return DispatchNative<int32_t>(out, a, b, count, op);
    case DataType::kI64:
      return DispatchNative<int64_t>(out, a, b, count, op);
    case DataType::kU8:
      return DispatchNative<uint8_t>(out, a, b, count, op);
  }
}

void ReduceInto(void* acc, const void* in, size_t count, DataType dtype, ReduceOp op) {
  ReduceTwo(acc, acc, in, count, dtype, op);
}

void FinalizeAvg(void* buf, size_t count, DataType dtype, ReduceOp op, int num_ranks) {
  if (op != ReduceOp::kAvg || num_ranks <= 1 || count == 0) return;
  switch (dtype) {
    case DataType::kF32:
      return DivideBy<float>(buf, count, num_ranks);
    case DataType::kI32:
      return DivideBy<int32_t>(buf, count, num_ranks);
    case DataType::kI64:
      return DivideBy<int64_t>(buf, count, num_ranks);
    case DataType::kU8:
      return DivideBy<uint8_t>(buf, count, num_ranks);
    case DataType::kF16:
    case DataType::kBf16: {
      alignas(64) float block[kBlock];
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (size_t start = 0; start < count; start += kBlock) {
        size_t n = std::min(kBlock, count - start);
        HalfToF32(p + start, block, n, dtype);
        for (size_t i = 0; i < n; ++i) block[i] /= static_cast<float>(num_ranks);
        F32ToHalf(block, p + start, n, dtype);
      }
      return;
    }
  }
}

void TreeReduce(std::span<const void* const> inputs, void* out, size_t count, DataType dtype,
                ReduceOp op) {
  TESSERA_CHECK(!inputs.empty());
  if (count == 0) return;
  const int n = static_cast<int>(inputs.size());
  if (n == 2 && !IsHalf(dtype)) {  // the tree is op(x0, x1): no staging
    ReduceTwo(out, inputs[0], inputs[1], count, dtype, op);
    FinalizeAvg(out, count, dtype, op, n);
    return;
  }
  switch (dtype) {
    case DataType::kF32:
      TreeReduceNative<float>(inputs, out, count, op);
      break;
    case DataType::kI32:
      TreeReduceNative<int32_t>(inputs, out, count, op);
      break;
    case DataType::kI64:
      TreeReduceNative<int64_t>(inputs, out, count, op);
      break;
    case DataType::kU8:
      TreeReduceNative<uint8_t>(inputs, out, count, op);
      break;
    case DataType::kF16:
    case DataType::kBf16:
      return TreeReduceHalf(inputs, out, count, dtype, op);  // divides for avg itself
  }
  FinalizeAvg(out, count, dtype, op, n);
}

}  // namespace tessera::comm
