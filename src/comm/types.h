// Element types and reduction operators of tessera::comm, with their names for
// flags, tables and errors. Layer: comm; used by the communicator, the algorithms
// and the benchmark.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera::comm {

enum class DataType : uint8_t { kF32, kF16, kBf16, kI32, kI64, kU8 };
inline constexpr DataType kAllDataTypes[] = {DataType::kF32, DataType::kF16, DataType::kBf16,
                                             DataType::kI32, DataType::kI64, DataType::kU8};

// Sum, product, minimum, maximum, mean. f16/bf16 accumulate in f32 and round once;
// integer avg is the sum divided by the rank count, truncated toward zero.
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};

size_t DataTypeSize(DataType dtype);
std::string_view DataTypeName(DataType dtype);  // "f32", "f16", "bf16", "i32", "i64", "u8"
std::optional<DataType> ParseDataType(std::string_view name);
std::string_view ReduceOpName(ReduceOp op);  // "sum", "prod", "min", "max", "avg"
std::optional<ReduceOp> ParseReduceOp(std::string_view name);

}  // namespace tessera::comm
