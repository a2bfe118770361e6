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
    // The first step sends this rank's block from the caller's buffer and copies it
    // into this rank's own output as it goes (SendOp::tee: each streamed chunk is
    // copied while it is still in cache, one read of the block instead of two; 2–4
    // MiB all-gathers of 2 ranks ran 5–17% faster); later steps forward what arrived.
    const void* from = s == 0 ? send : out + static_cast<size_t>(send_block) * bytes;
    SendOp so = SendOp::Copy(right, ctx.tag, from, bytes);
    if (s == 0 && copy_mine) so.tee = mine;
    RecvOp ro(left, ctx.tag, out + static_cast<size_t>(recv_block) * bytes, bytes);
    ctx.messenger.PostSend(&so);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so, &ro}));
  }
  if (n == 1 && copy_mine) ctx.messenger.CopyLocal(mine, send, bytes);
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
