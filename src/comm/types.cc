#include "comm/types.h"

namespace tessera::comm {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kF32:
    case DataType::kI32:
      return 4;
    case DataType::kF16:
    case DataType::kBf16:
      return 2;
    case DataType::kI64:
      return 8;
    case DataType::kU8:
      return 1;
  }
  return 1;
}

std::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kF32:
      return "f32";
    case DataType::kF16:
      return "f16";
    case DataType::kBf16:
      return "bf16";
    case DataType::kI32:
      return "i32";
    case DataType::kI64:
      return "i64";
    case DataType::kU8:
      return "u8";
  }
  return "?";
}

std::optional<DataType> ParseDataType(std::string_view name) {
  for (DataType dtype : kAllDataTypes) {
    if (DataTypeName(dtype) == name) return dtype;
  }
  if (name == "float" || name == "float32") return DataType::kF32;
  if (name == "half" || name == "float16") return DataType::kF16;
  if (name == "bfloat16") return DataType::kBf16;
  if (name == "int32") return DataType::kI32;
  if (name == "int64") return DataType::kI64;
  if (name == "uint8") return DataType::kU8;
  return std::nullopt;
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

std::optional<ReduceOp> ParseReduceOp(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (ReduceOpName(op) == name) return op;
  }
  return std::nullopt;
}

}  // namespace tessera::comm
