// Messenger (messenger.h): waiting. WaitAll drives every peer until the given ops
// are done, spinning while progress is likely and then sleeping (futex when every
// peer is on this host, ppoll otherwise); sleepers check that peers still live
// (failure flag, pidfd) and a timeout names the peers still waited on.
#include <poll.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <string>
#include <vector>

#include "comm/messenger.h"
#include "comm/messenger_wait_loop.h"

namespace tessera::comm {

Status Messenger::CheckLiveness() {
  const std::string frozen =
      "stopped responding: its heartbeat stood still for " +
      std::to_string(options_.frozen_peer_ms) +
      " ms while its process lives (SIGSTOP, a debugger or a hung system call?)";
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (peers_[p].shm_control == nullptr) {  // over TCP: its beat is in the store
      if (PeerFrozen(p, NowNs())) {
        return PeerError(p, UnavailableError("stopped responding: its heartbeat stood still for " +
                                             std::to_string(options_.frozen_peer_ms) +
                                             " ms while its connection stays open"));
      }
      continue;
    }
    if (peers_[p].shm_control->failed.load(std::memory_order_acquire) != 0) {
      return PeerError(p, AbortedError("failed"));
    }
    if (state_[p].pidfd.valid()) {
      pollfd pfd{state_[p].pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) <= 0) {
        if (PeerFrozen(p, NowNs())) return PeerError(p, UnavailableError(frozen));
        continue;
      }
      // The peer's process is gone. That is an error only if this operation still
      // needs it, and only once what it wrote before exiting has been drained (a
      // peer may send its last message and exit cleanly).
      PeerState& ps = state_[p];
      if (!ps.active() && !MailboxPending(p)) continue;
      Result<bool> progressed = ProgressPeer(p);
      if (!progressed.ok()) return progressed.status();
      if (*progressed) continue;
      return PeerError(p, UnavailableError("died"));
    }
  }
  return Status::Ok();
}

bool Messenger::PeerFrozen(int peer, int64_t now_ns) {
  PeerState& ps = state_[peer];
  if (options_.frozen_peer_ms <= 0 || (!ps.active() && !MailboxPending(peer) && !external_wait_)) {
    ps.heartbeat_seen_ns = 0;  // not waited on: watch afresh next time
    return false;
  }
  if (peers_[peer].shm_control != nullptr) {
    return HeartbeatStill(peer, peers_[peer].shm_control->heartbeat.load(std::memory_order_relaxed),
                          now_ns);
  }
  // Over TCP: read the peer's count from the store, at most every frozen / 5.
  if (failure_store_ == nullptr) return false;
  if (ps.heartbeat_seen_ns != 0 &&
      now_ns - ps.heartbeat_read_ns < options_.frozen_peer_ms * 200'000) {
    return now_ns - ps.heartbeat_seen_ns >= options_.frozen_peer_ms * 1'000'000;
  }
  ps.heartbeat_read_ns = now_ns;
  Result<int64_t> beat = failure_store_->Add("heartbeat/" + std::to_string(peer), 0);
  if (!beat.ok()) return false;  // the store's trouble is not the peer's
  return HeartbeatStill(peer, static_cast<uint64_t>(*beat), NowNs());
}

bool Messenger::HeartbeatStill(int peer, uint64_t beat, int64_t now_ns) {
  PeerState& ps = state_[peer];
  if (ps.heartbeat_seen_ns == 0 || beat != ps.seen_heartbeat) {
    ps.seen_heartbeat = beat;
    ps.heartbeat_seen_ns = now_ns;
    return false;
  }
  return now_ns - ps.heartbeat_seen_ns >= options_.frozen_peer_ms * 1'000'000;
}

void Messenger::Sleep(int64_t max_us) {
  if (!any_tcp_ && self_control_ != nullptr) {
    uint32_t bell = self_control_->doorbell.load(std::memory_order_seq_cst);
    self_control_->sleeping.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // Re-check after announcing the sleep (writers check `sleeping` after writing).
    bool ready = aborted_.load();
    if (mailbox_waiting_ != 0) {  // a peer published before seeing that we sleep
      int arrived = 0;
      for (int p = 0; p < size_; ++p) arrived += p == rank_ || !MailboxPending(p) ? 1 : 0;
      ready |= arrived > mailbox_arrived_;
    }
    for (int p = 0; p < size_ && !ready; ++p) {
      if (p == rank_) continue;
      PeerState& ps = state_[p];
      if (!ps.active()) continue;
      if (!ps.copy_sends.empty() && peers_[p].copy_acks_from->load(std::memory_order_acquire) >=
                                        ps.copy_sends.front()->copy_seq) {
        ready = true;  // the peer read our buffer before seeing that we sleep
        break;
      }
      if (!ps.sends.empty() && channels_[p]->HasRoom()) {
        ready = true;  // the reader freed room before seeing that we sleep
        break;
      }
      auto span = channels_[p]->Peek();
      if (!span.ok() || !span->empty()) ready = true;
    }
    if (!ready) FutexWait(&self_control_->doorbell, bell, max_us);
    self_control_->sleeping.store(0, std::memory_order_relaxed);
    return;
  }
  std::vector<pollfd> fds;
  int64_t held_until_ns = 0;  // earliest end of an emulated link delay (TESSERA_TCP_DELAY_US)
  // Some peer's arrival (or the external operation's end) cannot wake poll().
  bool nap = self_control_ != nullptr || external_wait_;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !state_[p].active()) continue;
    channels_[p]->AddPollFds(&fds, !state_[p].sends.empty());
    nap |= !channels_[p]->WakesPoll();
    const int64_t held = channels_[p]->HeldUntilNs();
    if (held != 0 && (held_until_ns == 0 || held < held_until_ns)) held_until_ns = held;
  }
  if (abort_event_.valid()) fds.push_back(pollfd{abort_event_.get(), POLLIN, 0});
  // Shared-memory and MPI peers cannot wake poll(): with some, nap only briefly.
  int64_t timeout_us = nap ? std::min<int64_t>(max_us, 50) : max_us;
  if (held_until_ns != 0) {
    timeout_us = std::clamp<int64_t>((held_until_ns - NowNs() + 999) / 1000, 0, timeout_us);
    // The emulated delay ends on a timeout, which Linux may extend by the thread's
    // timer slack (50 µs by default): half of a 0.1 ms link. Wake on time instead.
    thread_local const bool precise_timers = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
    (void)precise_timers;
  }
  timespec ts{static_cast<time_t>(timeout_us / 1'000'000),
              static_cast<long>((timeout_us % 1'000'000) * 1000)};
  ::ppoll(fds.data(), fds.size(), &ts, nullptr);
}

std::string Messenger::PendingSummary(std::span<Op* const> ops) const {
  if (external_wait_) return "every peer (an MPI collective)";
  std::string text;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerState& ps = state_[p];
    bool send = !ps.sends.empty();
    bool recv = !ps.recvs.empty() || ps.in != PeerState::In::kHeader || MailboxPending(p);
    if (!send && !recv) continue;
    if (!text.empty()) text += ", ";
    text += DescribePeer(p);
    text += send && recv ? " (send+recv)" : send ? " (send)" : " (recv)";
  }
  return text.empty() ? "nothing" : text;
}

Status Messenger::WaitAll(std::span<Op* const> ops) {
  if (!poison_.ok()) {
    return PoisonedError();
  }
  return WaitLoop(
      [&]() -> Result<PollResult> {
        PollResult result;
        for (int p = 0; p < size_; ++p) {
          if (p == rank_ || !state_[p].active()) continue;
          TESSERA_ASSIGN_OR_RETURN(bool progressed, ProgressPeer(p));
          result.progressed |= progressed;
        }
        result.done = std::all_of(ops.begin(), ops.end(), [](const Op* op) { return op->done; });
        return result;
      },
      ops);
}

Status Messenger::WaitExternal(const std::function<Result<bool>()>& done) {
  if (!poison_.ok()) return PoisonedError();
  external_wait_ = true;
  Status status = WaitLoop(
      [&]() -> Result<PollResult> {
        Result<bool> finished = done();
        if (!finished.ok()) return Poison(finished.status());
        return PollResult{*finished, false};
      },
      {});
  external_wait_ = false;
  return status;
}

}  // namespace tessera::comm
