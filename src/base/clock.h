// Monotonic time and deadlines. Layer: base. Every blocking operation in tessera
// takes a Deadline so that nothing waits forever.
#pragma once

#include <chrono>
#include <cstdint>

namespace tessera {

using Clock = std::chrono::steady_clock;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  static Deadline Never() { return Deadline(Clock::time_point::max()); }
  static Deadline AfterMs(int64_t timeout_ms) {
    return Deadline(Clock::now() + std::chrono::milliseconds(timeout_ms));
  }
  explicit Deadline(Clock::time_point when) : when_(when) {}

  bool Expired() const { return Clock::now() >= when_; }
  bool never() const { return when_ == Clock::time_point::max(); }
  Clock::time_point when() const { return when_; }
  // Milliseconds left, clamped to [0, INT32_MAX] (for poll(2)); -1 when never.
  int RemainingMsForPoll() const;

 private:
  Clock::time_point when_;
};

inline int Deadline::RemainingMsForPoll() const {
  if (never()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(when_ - Clock::now()).count();
  if (left < 0) return 0;
  if (left > INT32_MAX) return INT32_MAX;
  return static_cast<int>(left);
}

}  // namespace tessera
