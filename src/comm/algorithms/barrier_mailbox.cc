// Barrier through the shared-memory mailbox (every rank on this host): an empty
// exchange — each rank publishes, then waits until every peer has published.
// One cache-line hand-off per peer instead of ⌈log2 N⌉ message rounds.
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace tessera::comm::algorithms {

Status BarrierMailbox(Context& ctx) {
  std::vector<const void*> slots(static_cast<size_t>(ctx.size));
  return ctx.messenger.MailboxExchange(0, slots);
}

}  // namespace tessera::comm::algorithms
