#include "kv/block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "base/check.h"

namespace tessera::kv {

BlockHash RootBlockHash(std::string_view salt) {
  const XXH128_hash_t h = XXH3_128bits(salt.data(), salt.size());
  return {.low = h.low64, .high = h.high64};
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  TESSERA_CHECK(XXH3_128bits_reset(&state) == XXH_OK);
  const uint64_t head[2] = {parent.low, parent.high};
  TESSERA_CHECK(XXH3_128bits_update(&state, head, sizeof(head)) == XXH_OK);
  TESSERA_CHECK(XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes()) == XXH_OK);
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {.low = h.low64, .high = h.high64};
}

}  // namespace tessera::kv
