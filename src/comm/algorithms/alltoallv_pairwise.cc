// Pairwise-exchange all-to-all(v): for s = 1..N-1 rank r sends its block for
// r+s and receives the block of r-s. All steps are posted at once in that order,
// so every pair's transfer is in flight together and the per-peer FIFO order
// keeps the schedule; the local block is copied.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {
namespace {

// One past the last input byte any block reads.
size_t InputExtent(std::span<const size_t> bytes, std::span<const size_t> offsets) {
  size_t end = 0;
  for (size_t p = 0; p < bytes.size(); ++p) {
    if (bytes[p] > 0) end = std::max(end, offsets[p] + bytes[p]);
  }
  return end;
}

}  // namespace

Status AllToAllvPairwise(Context& ctx, const void* send, std::span<const size_t> send_bytes,
                         std::span<const size_t> send_offsets, void* recv,
                         std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets) {
  const int n = ctx.size;
  const int r = ctx.rank;
  const uint8_t* in = static_cast<const uint8_t*>(send);
  uint8_t* out = static_cast<uint8_t*>(recv);
  // The local block is copied once every transfer is posted, so the peers' single-
  // copy reads of this rank's buffer overlap it; unless the caller's buffers share
  // memory (then first, before any send can read what it overwrites).
  const size_t local = recv_bytes[r];
  const bool overlaps = local > 0 && in < out + recv_offsets[r] + local &&
                        out + recv_offsets[r] < in + InputExtent(send_bytes, send_offsets);
  if (overlaps) std::memmove(out + recv_offsets[r], in + send_offsets[r], local);
  std::vector<SendOp> sends(static_cast<size_t>(n));
  std::vector<RecvOp> recvs(static_cast<size_t>(n));
  std::vector<Op*> ops;
  ops.reserve(2 * static_cast<size_t>(n));
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    const int from = (r - s + n) % n;
    recvs[from] = RecvOp(from, ctx.tag, out + recv_offsets[from], recv_bytes[from]);
    ctx.messenger.PostRecv(&recvs[from]);
    ops.push_back(&recvs[from]);
    sends[to] = SendOp::Copy(to, ctx.tag, in + send_offsets[to], send_bytes[to]);
    ctx.messenger.PostSend(&sends[to]);
    ops.push_back(&sends[to]);
  }
  if (local > 0 && !overlaps) {
    TESSERA_RETURN_IF_ERROR(ctx.messenger.Progress());
    ctx.messenger.CopyLocal(out + recv_offsets[r], in + send_offsets[r], local);
  }
  TESSERA_RETURN_IF_ERROR(ctx.messenger.WaitAll(ops));
  for (int p = 0; p < n; ++p) {
    if (p != r && recvs[p].received != recv_bytes[p]) {
      return ctx.messenger.Poison(InvalidArgumentError(
          ctx.messenger.DescribePeer(p) + " sent " + std::to_string(recvs[p].received) +
          " bytes to all_to_allv where " + std::to_string(recv_bytes[p]) + " were expected"));
    }
  }
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
