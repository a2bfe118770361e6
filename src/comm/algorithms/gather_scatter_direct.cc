// Direct gather and scatter: the root posts one receive (send) per rank and
// waits for all, so every peer's transfer proceeds at once.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status GatherDirect(Context& ctx, const void* send, void* recv, size_t bytes, int root) {
  if (ctx.rank != root) {
    SendOp so = SendOp::Copy(root, ctx.tag, send, bytes);
    ctx.messenger.PostSend(&so);
    return ctx.messenger.WaitAll({&so});
  }
  uint8_t* out = static_cast<uint8_t*>(recv);
  uint8_t* mine = out + static_cast<size_t>(root) * bytes;
  if (send != mine && bytes > 0) std::memcpy(mine, send, bytes);
  std::vector<RecvOp> recvs(static_cast<size_t>(ctx.size));
  std::vector<Op*> ops;
  for (int p = 0; p < ctx.size; ++p) {
    if (p == root) continue;
    recvs[p] = RecvOp(p, ctx.tag, out + static_cast<size_t>(p) * bytes, bytes);
    ctx.messenger.PostRecv(&recvs[p]);
    ops.push_back(&recvs[p]);
  }
  return ctx.messenger.WaitAll(ops);
}

Status ScatterDirect(Context& ctx, const void* send, void* recv, size_t bytes, int root) {
  if (ctx.rank != root) {
    RecvOp ro(root, ctx.tag, recv, bytes);
    ctx.messenger.PostRecv(&ro);
    return ctx.messenger.WaitAll({&ro});
  }
  const uint8_t* in = static_cast<const uint8_t*>(send);
  const uint8_t* mine = in + static_cast<size_t>(root) * bytes;
  if (recv != mine && bytes > 0) std::memcpy(recv, mine, bytes);
  std::vector<SendOp> sends(static_cast<size_t>(ctx.size));
  std::vector<Op*> ops;
  for (int p = 0; p < ctx.size; ++p) {
    if (p == root) continue;
    sends[p] = SendOp::Copy(p, ctx.tag, in + static_cast<size_t>(p) * bytes, bytes);
    ctx.messenger.PostSend(&sends[p]);
    ops.push_back(&sends[p]);
  }
  return ctx.messenger.WaitAll(ops);
}

}  // namespace tessera::comm::algorithms
