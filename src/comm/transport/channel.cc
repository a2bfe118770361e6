#include "comm/transport/channel.h"

#include <cstring>

#include "comm/copy.h"

namespace tessera::comm {

Result<size_t> Channel::ReadInto(void* dst, size_t size, bool bypass_cache) {
  TESSERA_ASSIGN_OR_RETURN(auto span, Peek());
  size_t n = std::min(size, span.size());
  if (n == 0) return size_t{0};
  if (bypass_cache) {
    CopyBypassingCache(dst, span.data(), n);
  } else {
    std::memcpy(dst, span.data(), n);
  }
  Consume(n);
  return n;
}

}  // namespace tessera::comm
