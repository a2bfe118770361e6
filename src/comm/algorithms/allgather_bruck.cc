// Bruck all-gather: ceil(log2 N) steps. A staging buffer holds blocks in the
// order r, r+1, …; at distance d a rank sends its first min(d, N-d) blocks to
// r-d and appends the same number from r+d. A final rotation puts block i at
// position i. The latency choice for small blocks and many ranks.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status AllGatherBruck(Context& ctx, const void* send, void* recv, size_t bytes) {
  const int n = ctx.size;
  const int r = ctx.rank;
  uint8_t* out = static_cast<uint8_t*>(recv);
  uint8_t* tmp = ctx.Scratch(static_cast<size_t>(n) * bytes);
  if (bytes > 0) std::memcpy(tmp, send, bytes);
  for (int d = 1; d < n; d <<= 1) {
    const int blocks = std::min(d, n - d);
    SendOp so = SendOp::Copy((r - d + n) % n, ctx.tag, tmp, static_cast<size_t>(blocks) * bytes);
    RecvOp ro((r + d) % n, ctx.tag, tmp + static_cast<size_t>(d) * bytes,
              static_cast<size_t>(blocks) * bytes);
    ctx.messenger.PostSend(&so);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so, &ro}));
  }
  for (int i = 0; i < n && bytes > 0; ++i) {
    std::memcpy(out + static_cast<size_t>((r + i) % n) * bytes,
                tmp + static_cast<size_t>(i) * bytes, bytes);
  }
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
