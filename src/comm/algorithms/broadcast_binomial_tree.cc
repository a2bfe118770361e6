// Binomial-tree broadcast: in virtual ranks v = r - root, v receives from
// v - highest_bit(v) and forwards to v + 2^k for every 2^k above its highest bit.
// ceil(log2 N) rounds; the latency choice.
#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status BroadcastBinomialTree(Context& ctx, void* buffer, size_t bytes, int root) {
  const int n = ctx.size;
  const int v = (ctx.rank - root + n) % n;
  auto real = [&](int virt) { return (virt + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      RecvOp ro(real(v - mask), ctx.tag, buffer, bytes);
      ctx.messenger.PostRecv(&ro);
      TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll({&ro}));
      break;
    }
    mask <<= 1;
  }
  std::vector<SendOp> sends;
  sends.reserve(32);
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) sends.push_back(SendOp::Copy(real(v + mask), ctx.tag, buffer, bytes));
  }
  std::vector<Op*> ops;
  for (SendOp& so : sends) {
    ctx.messenger.PostSend(&so);
    ops.push_back(&so);
  }
  return ctx.messenger.WaitAll(ops);
}

}  // namespace tessera::comm::algorithms
