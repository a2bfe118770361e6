// Little-endian scalar decoding shared by the GGUF reader (gguf.cc) and the
// metadata accessors (gguf_metadata.cc). Layer: model; private to those files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/gguf.h"

namespace tessera::model::internal {

// Fixed size of a scalar element of `type`, 0 for string/array/unknown.
size_t ScalarSize(GgufType type);
bool IsKnownType(uint32_t id);
bool IsSigned(GgufType type);
// One little-endian numeric scalar of `type` at `p`, in the 64-bit storage
// GgufValue uses (sign-extended integers, f32 widened to a double's bits).
uint64_t DecodeScalarBits(GgufType type, const uint8_t* p);

}  // namespace tessera::model::internal
