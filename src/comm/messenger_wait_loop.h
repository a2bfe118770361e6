// Messenger::WaitLoop, the one waiting loop of the messenger: WaitAll
// (messenger_wait.cc) and MailboxExchange (messenger_mailbox.cc) run it with their
// poll. A template, so that each poll inlines into its loop. Layer: comm; internal
// to the messenger's files.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "base/clock.h"
#include "comm/messenger.h"

namespace tessera::comm {

template <typename Poll>
Status Messenger::WaitLoop(Poll&& poll, std::span<Op* const> ops) {
  int64_t last_progress_ns = 0;  // read from the clock once the first spins are over
  uint32_t spins = 0;
  bool slept = false;
  bool spun = false;
  bool work_left = static_cast<bool>(wait_work_);
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(PollResult polled, poll());
    if (polled.done) {
      constexpr int64_t kMinSpinNs = 2'000;
      if (!options_.yield_while_spinning) {
        // A core of our own: spinning starves nobody, and a sleep puts a wake-up
        // (tens of µs) on the critical path of whoever we wait for. Keep the full budget.
      } else if (slept) {
        current_spin_ns_ = std::max(current_spin_ns_ / 2, std::min(kMinSpinNs, options_.spin_ns));
      } else if (spun) {
        current_spin_ns_ = std::min(current_spin_ns_ * 2 + kMinSpinNs, options_.spin_ns);
      }
      return Status::Ok();
    }
    if (aborted_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      return Poison(AbortedError("communicator aborted during " +
                                 std::string(PrimitiveName(primitive_)) + ": " + abort_reason_));
    }
    if (polled.progressed) {
      last_progress_ns = 0;
      spins = 0;
      continue;
    }
    if (work_left) {  // the caller's useful work, a step between polls, before any spin
      work_left = wait_work_();
      continue;
    }
    spun = true;
    if ((++spins & 63) != 0 && !options_.yield_while_spinning) {
      _mm_pause();
      continue;
    }
    int64_t now = NowNs();
    if (last_progress_ns == 0) last_progress_ns = now;
    if (now - last_progress_ns < current_spin_ns_) {
      if (options_.yield_while_spinning) ::sched_yield();
      continue;
    }
    if (deadline_.Expired()) {
      return Poison(DeadlineExceededError(
          std::string(PrimitiveName(primitive_)) + " did not complete within " +
          std::to_string(options_.timeout_ms) + " ms; still waiting on " + PendingSummary(ops)));
    }
    if (now - last_liveness_ns_ >= options_.liveness_check_ms * 1'000'000) {
      last_liveness_ns_ = now;
      TESSERA_RETURN_IF_ERROR(CheckLiveness());
    }
    int64_t max_us = options_.liveness_check_ms * 1000;
    if (!deadline_.never()) {
      auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline_.when() - Clock::now())
              .count();
      max_us = std::clamp<int64_t>(left, 1, max_us);
    }
    slept = true;
    Sleep(max_us);
  }
}

}  // namespace tessera::comm
