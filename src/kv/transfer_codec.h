// TransferCodec: the dtype a KV block travels in between a prefill and a decode
// instance (--kv-transfer-dtype, docs/pd.md). kRaw sends the cache's own bytes
// (bit-identical decode); the others convert each block's elements, in the
// cache's order, on the prefill side and back into the cache's dtype on the
// decode side: f16 (exact from an f16 cache, rounding from f32), q8_0 (groups of
// 32: an f16 scale max|x|/127 and 32 int8, 34 bytes — llama.cpp's block layout)
// fp8 e4m3 (1 byte, no scale, saturating at ±448) and mxfp8 (the OCP
// microscaling layout: groups of 32 e4m3 elements sharing a power-of-two E8M0
// scale, 33 bytes; the scale is the smallest that keeps the group's largest
// magnitude within ±448, so nothing saturates). The lossy ones change the
// decode's logits slightly (measured in docs/results.md). Layer: kv.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kv/kv_cache.h"

namespace tessera::kv {

enum class WireType : uint32_t { kRaw = 0, kF16 = 1, kQ8_0 = 2, kFp8E4M3 = 3, kMxFp8 = 4 };

// "" or "raw" → kRaw; "f16", "q8_0", "fp8_e4m3", "mxfp8"; nullopt otherwise.
std::optional<WireType> ParseWireType(std::string_view name);
std::string_view WireTypeName(WireType type);  // "raw", "f16", "q8_0", "fp8_e4m3", "mxfp8"
// The planner's dtype name of what travels: the cache's ("f16"/"f32") for kRaw.
std::string_view WirePlanDType(WireType type, const KvCacheShape& shape);

// A block travels layer by layer: its wire form is each layer's K and V encoded
// apart (q8_0's and mxfp8's groups never span two layers), one after another.
// Bytes of one layer of a block on the wire, and of a whole block.
int64_t WireBytesPerLayer(const KvCacheShape& shape, WireType type);
int64_t WireBytesPerBlock(const KvCacheShape& shape, WireType type);

// One cache block (shape.BytesPerBlock() bytes) → WireBytesPerBlock bytes.
void EncodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* block, uint8_t* wire);
// Back: WireBytesPerBlock bytes → one cache block.
void DecodeBlock(const KvCacheShape& shape, WireType type, const uint8_t* wire, uint8_t* block);
// Layers [layer_begin, layer_end) only, each at its place in both forms.
void EncodeLayers(const KvCacheShape& shape, WireType type, int32_t layer_begin, int32_t layer_end,
                  const uint8_t* block, uint8_t* wire);
void DecodeLayers(const KvCacheShape& shape, WireType type, int32_t layer_begin, int32_t layer_end,
                  const uint8_t* wire, uint8_t* block);

// fp8 e4m3 (bias 7, no infinities, max 448), round to nearest even, saturating.
uint8_t F32ToFp8E4M3(float x);
float Fp8E4M3ToF32(uint8_t v);
// mxfp8's shared scale of a group whose largest magnitude is `amax`: the E8M0 byte
// (2^(byte - 127)) of the smallest s in [-127, 127] with amax / 2^s <= 448 (amax 0
// or not finite: byte 0).
uint8_t MxScaleByte(float amax);

}  // namespace tessera::kv
