// BlockHash: the identity of a full KV block for prefix caching — XXH3-128 chained
// over the parent block's hash and the block's tokens, from a root that salts the
// chain with whatever else changes the block's K/V (model, KV dtype, block size).
// Equal hashes mean equal prefixes up to a 128-bit collision; the allocator also
// compares the block's tokens and parent hash on a hit (block_allocator.h). Layer:
// kv; the scheduler hashes each sequence's full blocks. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tessera::kv {

struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;
  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low); }
};

// The hash every chain starts from: XXH3-128 of `salt` (a description of what the
// cache's K/V depend on besides the tokens, e.g. "llama dim=768 ... kv=f16 bs=16").
BlockHash RootBlockHash(std::string_view salt);

// The hash of the block after `parent` (RootBlockHash for the first block) that
// holds `tokens`: XXH3-128 of parent.low, parent.high, then the token ids
// (little-endian int32).
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens);

}  // namespace tessera::kv
