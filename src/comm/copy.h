// Copies for large messages. A receive or local block of many MiB is written once
// and read much later, if at all, by the caller: storing it past the cache
// (non-temporal stores) saves the read-for-ownership of every destination line
// and keeps the caches for the ring, measured 1.4-2x faster than memcpy here once
// source and destination leave the last-level cache.
#pragma once

#include <cstddef>

namespace tessera::comm {

// memcpy whose destination bypasses the cache (non-temporal stores on x86-64;
// plain memcpy elsewhere). The stores are fenced before it returns, so the bytes
// are visible to another rank once a later release store is.
void CopyBypassingCache(void* dst, const void* src, size_t bytes);

}  // namespace tessera::comm
