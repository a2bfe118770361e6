// Binomial-tree reduce to the root: in virtual ranks v = r - root, v reduces the
// partials of v + 2^k (k below its lowest set bit) and sends its partial to
// v - lowest_bit(v). The first reduction reads the input, so leaves send
// straight from it.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace tessera::comm::algorithms {

Status ReduceBinomialTree(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                          ReduceOp op, int root) {
  const int n = ctx.size;
  const int v = (ctx.rank - root + n) % n;
  const size_t bytes = count * DataTypeSize(dtype);
  auto real = [&](int virt) { return (virt + root) % n; };
  uint8_t* acc = v == 0 ? static_cast<uint8_t*>(recv) : ctx.Scratch(bytes);
  const void* current = send;  // where this rank's partial lives
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      SendOp so = SendOp::Reducing(real(v - mask), ctx.tag, current, bytes);
      ctx.messenger.PostSend(&so);
      return ctx.messenger.WaitAll({&so});
    }
    if (v + mask < n) {
      RecvOp ro = RecvOp::Reduce(real(v + mask), ctx.tag, acc, bytes, dtype, op, current);
      ctx.messenger.PostRecv(&ro);
      TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&ro}));
      current = acc;
    }
  }
  // Only the root gets here.
  if (current != acc && bytes > 0) std::memcpy(acc, current, bytes);
  FinalizeAvg(acc, count, dtype, op, n);
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
