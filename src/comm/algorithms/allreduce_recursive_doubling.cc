// Recursive-doubling all-reduce for small messages. With p the largest power of
// two <= N, ranks p..N-1 first fold their data into rank r-p, the p ranks
// exchange whole buffers with partner r^mask for each mask, and the folded ranks
// get the result back. Every pairwise combination is op(a, b) on both sides of a
// commutative op, so all ranks end with identical bits.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace tessera::comm::algorithms {

Status AllReduceRecursiveDoubling(Context& ctx, const void* send, void* recv, size_t count,
                                  DataType dtype, ReduceOp op) {
  const int n = ctx.size;
  const int r = ctx.rank;
  const size_t bytes = count * DataTypeSize(dtype);
  uint8_t* out = static_cast<uint8_t*>(recv);
  if (send != recv && bytes > 0) std::memcpy(out, send, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  uint8_t* tmp = ctx.Scratch(bytes);

  if (r >= p) {  // fold in, then wait for the result
    SendOp so(r - p, ctx.tag, out, bytes);
    ctx.messenger.PostSend(&so);
    RecvOp ro(r - p, ctx.tag, out, bytes);
    ctx.messenger.PostRecv(&ro);
    return ctx.messenger.WaitAll({&so, &ro});
  }
  if (r + p < n) {
    RecvOp ro = RecvOp::Reduce(r + p, ctx.tag, out, bytes, dtype, op);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&ro}));
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = r ^ mask;
    SendOp so = SendOp::Copy(partner, ctx.tag, out, bytes);
    RecvOp ro(partner, ctx.tag, tmp, bytes);
    ctx.messenger.PostSend(&so);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so, &ro}));
    // Lower rank's data first: op(lower, upper) on both partners.
    if (r < partner) {
      ReduceTwo(out, out, tmp, count, dtype, op);
    } else {
      ReduceTwo(out, tmp, out, count, dtype, op);
    }
  }
  FinalizeAvg(out, count, dtype, op, n);
  if (r + p < n) {
    SendOp so = SendOp::Copy(r + p, ctx.tag, out, bytes);
    ctx.messenger.PostSend(&so);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so}));
  }
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
