// One-shot all-reduce through the shared-memory mailbox (every rank on this
// host): each rank copies its input into its own slot, publishes it, and — once
// every peer has published — combines the N slots in place with the canonical
// tree over rank index (TreeReduce). One cache-line hand-off per peer for tiny
// messages, no framing, no second round; and since every rank computes the same
// tree from the same inputs, it meets the deterministic all-reduce's contract.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce.h"

namespace tessera::comm::algorithms {

Status AllReduceOneShot(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                        ReduceOp op) {
  const size_t bytes = count * DataTypeSize(dtype);
  std::memcpy(ctx.messenger.MailboxSlot(), send, bytes);
  constexpr int kInline = 16;
  const void* inline_slots[kInline];
  std::vector<const void*> heap_slots;
  std::span<const void*> slots(inline_slots, static_cast<size_t>(ctx.size));
  if (ctx.size > kInline) {
    heap_slots.resize(static_cast<size_t>(ctx.size));
    slots = heap_slots;
  }
  TESSERA_RETURN_IF_ERROR(ctx.messenger.MailboxExchange(bytes, slots));
  slots[ctx.rank] = send;  // our own input, not its copy
  TreeReduce(slots, recv, count, dtype, op);
  return Status::Ok();
}

}  // namespace tessera::comm::algorithms
