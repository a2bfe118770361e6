#include "kv/transfer_frame.h"

#include <string>

namespace tessera::kv {
namespace {

// Offsets of the fields in the 64-byte frame (the rest is zero).
constexpr size_t kMagicAt = 0, kVersionAt = 4, kTypeAt = 6, kIdAt = 8, kFirstBlockAt = 16,
                 kNumBlocksAt = 20, kNumTokensAt = 24, kBlockSizeAt = 28, kBlockBytesAt = 32,
                 kKvTypeAt = 40, kStatusAt = 44, kWireTypeAt = 48, kFlagsAt = 52,
                 kLayerBeginAt = 56, kNumLayersAt = 60;

template <typename T>
void Put(std::array<uint8_t, kTransferHeaderBytes>& out, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[at + i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  }
}

template <typename T>
T Get(std::span<const uint8_t> in, size_t at) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<uint64_t>(in[at + i]) << (8 * i);
  return static_cast<T>(value);
}

}  // namespace

std::array<uint8_t, kTransferHeaderBytes> EncodeTransferHeader(const TransferHeader& h) {
  std::array<uint8_t, kTransferHeaderBytes> out{};
  Put<uint32_t>(out, kMagicAt, kTransferMagic);
  Put<uint16_t>(out, kVersionAt, kTransferVersion);
  Put<uint16_t>(out, kTypeAt, static_cast<uint16_t>(h.type));
  Put<uint64_t>(out, kIdAt, h.transfer_id);
  Put<uint32_t>(out, kFirstBlockAt, h.first_block);
  Put<uint32_t>(out, kNumBlocksAt, h.num_blocks);
  Put<uint32_t>(out, kNumTokensAt, h.num_tokens);
  Put<uint32_t>(out, kBlockSizeAt, h.block_size);
  Put<uint64_t>(out, kBlockBytesAt, h.bytes_per_block);
  Put<uint32_t>(out, kKvTypeAt, h.kv_type);
  Put<uint32_t>(out, kStatusAt, h.status);
  Put<uint32_t>(out, kWireTypeAt, h.wire_type);
  Put<uint32_t>(out, kFlagsAt, h.flags);
  Put<uint32_t>(out, kLayerBeginAt, h.layer_begin);
  Put<uint32_t>(out, kNumLayersAt, h.num_layers);
  return out;
}

Result<TransferHeader> DecodeTransferHeader(std::span<const uint8_t> frame) {
  if (frame.size() != kTransferHeaderBytes) {
    return InvalidArgumentError("KV transfer frame of " + std::to_string(frame.size()) +
                                " bytes (expected " + std::to_string(kTransferHeaderBytes) + ")");
  }
  if (Get<uint32_t>(frame, kMagicAt) != kTransferMagic) {
    return InvalidArgumentError("KV transfer frame: bad magic");
  }
  const uint16_t version = Get<uint16_t>(frame, kVersionAt);
  if (version != kTransferVersion) {
    return InvalidArgumentError("KV transfer frame: version " + std::to_string(version) +
                                " (this build speaks " + std::to_string(kTransferVersion) + ")");
  }
  const uint16_t type = Get<uint16_t>(frame, kTypeAt);
  if (type < static_cast<uint16_t>(TransferType::kRequest) ||
      type > static_cast<uint16_t>(TransferType::kBurst)) {
    return InvalidArgumentError("KV transfer frame: unknown type " + std::to_string(type));
  }
  TransferHeader h;
  h.type = static_cast<TransferType>(type);
  h.transfer_id = Get<uint64_t>(frame, kIdAt);
  h.first_block = Get<uint32_t>(frame, kFirstBlockAt);
  h.num_blocks = Get<uint32_t>(frame, kNumBlocksAt);
  h.num_tokens = Get<uint32_t>(frame, kNumTokensAt);
  h.block_size = Get<uint32_t>(frame, kBlockSizeAt);
  h.bytes_per_block = Get<uint64_t>(frame, kBlockBytesAt);
  h.kv_type = Get<uint32_t>(frame, kKvTypeAt);
  h.status = Get<uint32_t>(frame, kStatusAt);
  h.wire_type = Get<uint32_t>(frame, kWireTypeAt);
  h.flags = Get<uint32_t>(frame, kFlagsAt);
  h.layer_begin = Get<uint32_t>(frame, kLayerBeginAt);
  h.num_layers = Get<uint32_t>(frame, kNumLayersAt);
  if ((h.flags & ~(kLastBurst | kPrefillEnded)) != 0) {
    return InvalidArgumentError("KV transfer frame: unknown flags " + std::to_string(h.flags));
  }
  if (h.wire_type > kMaxWireType) {
    return InvalidArgumentError("KV transfer frame: unknown wire type " +
                                std::to_string(h.wire_type));
  }
  if (h.num_blocks > kMaxTransferBlocks || h.first_block > kMaxTransferBlocks) {
    return InvalidArgumentError("KV transfer frame: " + std::to_string(h.first_block) + " + " +
                                std::to_string(h.num_blocks) + " blocks exceed the bound of " +
                                std::to_string(kMaxTransferBlocks));
  }
  if (h.num_tokens > kMaxTransferTokens) {
    return InvalidArgumentError("KV transfer frame: " + std::to_string(h.num_tokens) +
                                " tokens exceed the bound of " +
                                std::to_string(kMaxTransferTokens));
  }
  if (h.bytes_per_block > kMaxTransferBlockBytes) {
    return InvalidArgumentError("KV transfer frame: blocks of " +
                                std::to_string(h.bytes_per_block) + " bytes exceed the bound");
  }
  if (h.num_layers > kMaxTransferLayers || h.layer_begin > kMaxTransferLayers - h.num_layers) {
    return InvalidArgumentError("KV transfer frame: layers " + std::to_string(h.layer_begin) +
                                " + " + std::to_string(h.num_layers) + " exceed the bound of " +
                                std::to_string(kMaxTransferLayers));
  }
  if (h.type == TransferType::kBurst && (h.flags & kLastBurst) != 0 && h.num_blocks != 0) {
    return InvalidArgumentError("KV transfer frame: a last burst carrying " +
                                std::to_string(h.num_blocks) + " blocks");
  }
  if (h.type == TransferType::kRequest &&
      (h.num_layers == 0 || h.layer_begin != 0 || h.bytes_per_block % h.num_layers != 0)) {
    return InvalidArgumentError("KV transfer request: blocks of " +
                                std::to_string(h.bytes_per_block) + " bytes in " +
                                std::to_string(h.num_layers) + " layer pieces");
  }
  if (h.type == TransferType::kRequest) {
    if (h.block_size == 0 || h.num_blocks == 0 ||
        uint64_t{h.num_tokens} != uint64_t{h.first_block + h.num_blocks} * h.block_size) {
      return InvalidArgumentError("KV transfer request: " + std::to_string(h.num_tokens) +
                                  " tokens are not the " +
                                  std::to_string(h.first_block + h.num_blocks) + " blocks of " +
                                  std::to_string(h.block_size) + " it asks for");
    }
  }
  return h;
}

}  // namespace tessera::kv
