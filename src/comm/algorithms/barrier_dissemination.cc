// Dissemination barrier: in round k rank r signals r + 2^k and waits for r - 2^k;
// after ceil(log2 N) rounds every rank has (transitively) heard from all.
#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status BarrierDissemination(Context& ctx) {
  const int n = ctx.size;
  for (int d = 1; d < n; d <<= 1) {
    SendOp so((ctx.rank + d) % n, ctx.tag, nullptr, 0);
    RecvOp ro((ctx.rank - d + n) % n, ctx.tag, nullptr, 0);
    ctx.messenger.PostSend(&so);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so, &ro}));
  }
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
