// Ring reduce-scatter: N-1 steps; at step s rank r sends its partial of block
// r-s-1 to the right and reduces the left neighbour's partial of block r-s-2
// into scratch (the last step lands block r in the output). Each block's first
// reduction reads the input directly.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace tessera::comm::algorithms {

Status ReduceScatterRing(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) {
  const int n = ctx.size;
  const int r = ctx.rank;
  const size_t bytes = count * DataTypeSize(dtype);
  const uint8_t* in = static_cast<const uint8_t*>(send);
  uint8_t* out = static_cast<uint8_t*>(recv);
  if (n == 1) {
    if (out != in && bytes > 0) std::memcpy(out, in, bytes);
    return Status::Ok();
  }
  uint8_t* partial = ctx.Scratch(static_cast<size_t>(n) * bytes);
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  auto mod = [n](int v) { return ((v % n) + n) % n; };
  for (int s = 0; s < n - 1; ++s) {
    const size_t send_block = static_cast<size_t>(mod(r - s - 1));
    const size_t recv_block = static_cast<size_t>(mod(r - s - 2));
    const uint8_t* src = (s == 0 ? in : partial) + send_block * bytes;
    uint8_t* dst = s == n - 2 ? out : partial + recv_block * bytes;
    SendOp so = SendOp::Reducing(right, ctx.tag, src, bytes);
    RecvOp ro = RecvOp::Reduce(left, ctx.tag, dst, bytes, dtype, op, in + recv_block * bytes);
    ctx.messenger.PostSend(&so);
    ctx.messenger.PostRecv(&ro);
    TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&so, &ro}));
  }
  FinalizeAvg(out, count, dtype, op, n);
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
