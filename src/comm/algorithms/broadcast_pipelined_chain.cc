// Pipelined-chain broadcast: ranks form a chain from the root (virtual order
// r - root); the buffer moves in chunks, and each rank forwards chunk c while
// it receives chunk c+1, so the time approaches M / bandwidth for any N.
#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status BroadcastPipelinedChain(Context& ctx, void* buffer, size_t bytes, int root,
                               size_t chunk_bytes) {
  const int n = ctx.size;
  const int v = (ctx.rank - root + n) % n;
  const int prev = (ctx.rank - 1 + n) % n;
  const int next = (ctx.rank + 1) % n;
  uint8_t* buf = static_cast<uint8_t*>(buffer);
  chunk_bytes = std::max<size_t>(chunk_bytes, 1);
  const size_t chunks = bytes == 0 ? 1 : (bytes + chunk_bytes - 1) / chunk_bytes;
  std::vector<SendOp> sends(v < n - 1 ? chunks : 0);
  std::vector<Op*> pending;
  for (size_t c = 0; c < chunks; ++c) {
    size_t offset = c * chunk_bytes;
    size_t len = std::min(chunk_bytes, bytes - std::min(bytes, offset));
    if (v > 0) {
      RecvOp ro(prev, ctx.tag, buf + offset, len);
      ctx.messenger.PostRecv(&ro);
      TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&ro}));
    }
    if (v < n - 1) {
      sends[c] = SendOp::Copy(next, ctx.tag, buf + offset, len);
      ctx.messenger.PostSend(&sends[c]);
      pending.push_back(&sends[c]);
    }
  }
  return ctx.messenger.WaitAll(pending);
}

}  // namespace tessera::comm::algorithms
