// Ring all-gather: N-1 steps; at step s rank r forwards block r-s to the right and
// receives block r-s-1 from the left, straight into the output.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status AllGatherRing(Context& ctx, const void* send, void* recv, size_t bytes) {
  const int n = ctx.size;
  const int r = ctx.rank;
  uint8_t* out = static_cast<uint8_t*>(recv);
  uint8_t* mine = out + static_cast<size_t>(r) * bytes;
  const bool copy_mine = send != mine && bytes > 0;
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    int send_block = ((r - s) % n + n) % n;
    int recv_block = ((r - s - 1) % n + n) % n;
    // The first step sends this rank's block from the caller's buffer, so the right
    // neighbour (a single-copy reader) reads clean lines while this rank copies
    // them into its own output; later steps forward what arrived.
    const void* from = s == 0 ? send : out + static_cast<size_t>(send_block) * bytes;
    SendOp so = SendOp::Copy(right, ctx.tag, from, bytes);
    RecvOp ro(left, ctx.tag, out + static_cast<size_t>(recv_block) * bytes, bytes);
    ctx.engine.PostSend(&so);
    ctx.engine.PostRecv(&ro);
    if (s == 0 && copy_mine) {
      TESSERA_RETURN_IF_ERROR(ctx.engine.Progress());
      ctx.engine.CopyLocal(mine, send, bytes);
    }
    TESSERA_RETURN_IF_ERROR(ctx.engine.WaitAll({&so, &ro}));
  }
  if (n == 1 && copy_mine) ctx.engine.CopyLocal(mine, send, bytes);
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
