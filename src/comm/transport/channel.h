// Channel: a reliable, ordered, nonblocking byte stream to one peer. Transports
// (shm rings, TCP sockets) implement it; the messenger (messenger.h) frames
// messages on top, and algorithms never see which transport carries them.
// Layer: comm. A Channel is used by one thread at a time (its communicator's).
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::comm {

class Channel {
 public:
  virtual ~Channel() = default;

  // Appends up to `size` bytes to the stream without blocking; returns how many
  // were accepted (0 when the transport's buffer is full).
  virtual Result<size_t> Write(const void* data, size_t size) = 0;
  // The next contiguous readable bytes (empty when none have arrived). Until
  // Consume, repeated calls return the same bytes (possibly more of them). When
  // at least 8 bytes are in flight, the span eventually holds at least 8 bytes or
  // ends on an 8-byte boundary of the stream, so reducers see whole elements.
  virtual Result<std::span<const uint8_t>> Peek() = 0;
  virtual void Consume(size_t size) = 0;
  // Copies up to `size` readable bytes into `dst` (the TCP channel receives
  // straight into `dst`); returns how many. `bypass_cache`: `dst` belongs to a
  // message large enough that a copy out of the transport's own buffer should
  // store past the cache (CopyBypassingCache); the kernel's copy ignores it.
  virtual Result<size_t> ReadInto(void* dst, size_t size, bool bypass_cache);

  // Called after Write accepted bytes: wakes the peer if it sleeps.
  virtual void NotifyPeer() {}
  // Whether a Write would now accept a useful amount (for the sleep re-check).
  virtual bool HasRoom() const { return true; }
  // For sleeping in poll(2): the descriptors that would signal progress (TCP).
  virtual void AddPollFds(std::vector<pollfd>* fds, bool want_write) const {}
  // Whether an arrival wakes a sleeper in poll(2) (through AddPollFds). When not
  // (MPI), a waiting rank only naps.
  virtual bool WakesPoll() const { return true; }
  // When bytes have arrived but are held back (emulated link delay), the
  // steady-clock time (NowNs) at which they become readable: a sleeper must wake
  // by then. 0 when nothing is held.
  virtual int64_t HeldUntilNs() const { return 0; }
  // Closes the stream so the peer notices promptly (after an error).
  virtual void Shutdown() {}
  // "shm" or "tcp 10.0.0.7:41234 (x4)".
  virtual std::string Describe() const = 0;
};

}  // namespace tessera::comm
