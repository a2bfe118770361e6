// Ring all-gather: N-1 steps; at step s rank r forwards block r-s to the right and
// receives block r-s-1 from the left, straight into the output.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status AllGatherRing(Context& ctx, const void* send, void* recv, size_t bytes) {
  const int n = ctx.size;
  const int r = ctx.rank;
  uint8_t* out = static_cast<uint8_t*>(recv);
  if (send != out + static_cast<size_t>(r) * bytes && bytes > 0) {
    std::memcpy(out + static_cast<size_t>(r) * bytes, send, bytes);
  }
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    int send_block = ((r - s) % n + n) % n;
    int recv_block = ((r - s - 1) % n + n) % n;
    SendOp so = SendOp::Copy(right, ctx.tag, out + static_cast<size_t>(send_block) * bytes, bytes);
    RecvOp ro(left, ctx.tag, out + static_cast<size_t>(recv_block) * bytes, bytes);
    ctx.engine.PostSend(&so);
    ctx.engine.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.engine.WaitAll({&so, &ro}));
  }
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
