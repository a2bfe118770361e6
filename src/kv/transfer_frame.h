// TransferFrame: the control frames of a KV-cache transfer between a prefill
// instance and a decode instance (prefill/decode disaggregation, docs/pd.md) —
// fixed 64-byte little-endian headers, typed and versioned, decoded only into
// this struct with every field checked against bounds before anything is sized
// from it. The K/V itself is not framed here: it travels as pieces, one layer of
// one block each (the layer's K then V in the cache's layout, in the wire dtype:
// bytes_per_block / num_layers bytes), which the receiver takes straight into the
// blocks it allocated. Layer: kv (pure data; serve/pd_link.* moves the frames).
//
// Exchange, per transfer (ids chosen by the decode side, unique per link):
//   decode → prefill  kRequest {id, first_block, num_blocks, num_tokens, block
//                     size, bytes per block, kv type, num_layers}, then one
//                     message of num_tokens int32 token ids (the blocks' tokens
//                     from the start)
//   prefill → decode  kReply {id, status, num_blocks, …}: status 0, the prefill is
//                     accepted and its blocks will stream; else refused, nothing follows
//   decode → prefill  kReady (it posted a receive for every piece, per layer in
//                     block order) or kAbort
//   prefill → decode  bursts, as the prefill's steps (and, on a one-rank
//                     instance, each layer within a step) make pieces final: a
//                     kBurst {first_block: the burst's first block among the
//                     transfer's, num_blocks, layer_begin, num_layers, status,
//                     flags} on the transfer's control tag, then the pieces
//                     (block, layer) of those blocks and layers, each on its
//                     layer's data tag. Per layer, blocks go in order. Bursts
//                     sent once the prefill has ended are flagged kPrefillEnded;
//                     the last, flagged kLastBurst too, carries no blocks and ends
//                     the transfer. A burst with status != 0 (the prefill failed)
//                     carries empty messages for its pieces (every posted
//                     receive completes) and fails the transfer.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "base/status.h"

namespace tessera::kv {

inline constexpr uint32_t kTransferMagic = 0x5854564B;  // "KVTX"
inline constexpr uint16_t kTransferVersion = 3;         // 3: layer pieces
inline constexpr size_t kTransferHeaderBytes = 64;
// Bounds on what a frame may announce (a request above them is refused as malformed).
inline constexpr uint32_t kMaxTransferBlocks = 1 << 16;
inline constexpr uint32_t kMaxTransferTokens = 1 << 22;
inline constexpr uint64_t kMaxTransferBlockBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxWireType = 4;
inline constexpr uint32_t kMaxTransferLayers = 1024;

enum class TransferType : uint16_t { kRequest = 1, kReply = 2, kReady = 3, kAbort = 4, kBurst = 5 };
// kBurst flags.
inline constexpr uint32_t kLastBurst = 1;     // nothing follows (num_blocks 0)
inline constexpr uint32_t kPrefillEnded = 2;  // sent after the prefill ended

struct TransferHeader {
  TransferType type = TransferType::kRequest;
  uint64_t transfer_id = 0;
  uint32_t first_block = 0;  // the request's blocks start after this many (its cached prefix)
  uint32_t num_blocks = 0;
  uint32_t num_tokens = 0;  // kRequest: (first_block + num_blocks) · block_size
  uint32_t block_size = 0;
  uint64_t bytes_per_block = 0;
  uint32_t kv_type = 0;    // kernels::KvType as an integer
  uint32_t status = 0;     // kReply: 0 ok, else a StatusCode (no blocks follow)
  uint32_t wire_type = 0;  // kv::WireType the blocks travel in (transfer_codec.h)
  uint32_t flags = 0;      // kBurst: kLastBurst, kPrefillEnded
  // kRequest, kReply: the model's layers (a block's pieces); kBurst: the layers
  // [layer_begin, layer_begin + num_layers) of its blocks.
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;
};

std::array<uint8_t, kTransferHeaderBytes> EncodeTransferHeader(const TransferHeader& header);
// InvalidArgument (naming the field) for a frame of the wrong size, magic,
// version or type, or a field beyond the bounds above; a kRequest must also
// announce exactly (first_block + num_blocks) · block_size tokens, and at least
// one layer whose pieces split its blocks' bytes evenly; a kLastBurst carries no
// blocks.
Result<TransferHeader> DecodeTransferHeader(std::span<const uint8_t> frame);

}  // namespace tessera::kv
