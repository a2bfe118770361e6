// Messenger (messenger.h): the mailbox, a one-shot exchange through the two slots
// every rank has in its shared-memory segment, there when all ranks share this
// host. The exchange waits in the messenger's loop (messenger_wait_loop.h).
#include "base/check.h"
#include "comm/messenger.h"
#include "comm/messenger_wait_loop.h"

namespace tessera::comm {

void Messenger::EnableMailbox(size_t bytes) {
  for (int p = 0; p < size_; ++p) {
    TESSERA_CHECK(peers_[p].mailbox[0] != nullptr && peers_[p].mailbox[1] != nullptr)
        << "rank " << p << " has no mailbox";
  }
  mailbox_bytes_ = bytes;
}

uint8_t* Messenger::MailboxSlot() {
  TESSERA_CHECK_GT(mailbox_bytes_, 0u);
  return peers_[rank_].mailbox[(mailbox_seq_ + 1) & 1]->data();
}

Status Messenger::MailboxExchange(size_t bytes, std::span<const void*> slots) {
  TESSERA_CHECK(bytes <= mailbox_bytes_ && slots.size() == static_cast<size_t>(size_));
  if (!poison_.ok()) {
    return PoisonedError();
  }
  const uint64_t seq = ++mailbox_seq_;
  const int index = static_cast<int>(seq & 1);
  peers_[rank_].mailbox[index]->seq.store(seq, std::memory_order_release);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) WakeIfSleeping(peers_[p].shm_control);
  }
  LedgerEntry& entry = ledger_.mutable_entry(primitive_);
  entry.bytes_sent += bytes * static_cast<size_t>(size_ - 1);
  entry.bytes_received += bytes * static_cast<size_t>(size_ - 1);
  mailbox_waiting_ = seq;
  mailbox_arrived_ = 1;
  // A published slot stays published until we publish the next exchange, so the
  // count only grows.
  Status status = WaitLoop(
      [&]() -> Result<PollResult> {
        int arrived = 1;
        for (int p = 0; p < size_; ++p) arrived += p != rank_ && !MailboxPending(p) ? 1 : 0;
        PollResult result{.done = arrived == size_, .progressed = arrived > mailbox_arrived_};
        mailbox_arrived_ = arrived;
        return result;
      },
      {});
  mailbox_waiting_ = 0;
  TESSERA_RETURN_IF_ERROR(status);
  for (int p = 0; p < size_; ++p) slots[p] = peers_[p].mailbox[index]->data();
  return Status::Ok();
}

}  // namespace tessera::comm
