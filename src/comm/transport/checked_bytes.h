// CheckedBytes: the read side of a channel that checks what it receives before
// handing it out (AuthenticatedChannel's tags, TlsChannel's records). It holds the
// checked bytes [begin, end) of one buffer with room after them for the next
// record, and keeps their addresses at the stream offset's alignment mod 8, so a
// short checked tail joins the next record's bytes and readers see whole 8-byte
// elements (the Channel contract). Layer: comm. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "base/check.h"
#include "base/status.h"

namespace tessera::comm {

class CheckedBytes {
 public:
  // Room for `capacity` bytes of records, plus a tail and alignment slack.
  explicit CheckedBytes(size_t capacity)
      : capacity_(16 + capacity), buffer_(std::make_unique<uint8_t[]>(capacity_)) {}

  size_t size() const { return end_ - begin_; }

  // The checked bytes, after `fill` (which reads and checks more into tail()) when
  // fewer than 8 are here. Bytes checked before an error stay readable (the peer
  // may have sent them and then gone); the error comes once they are consumed.
  template <typename Fill>
  Result<std::span<const uint8_t>> Peek(Fill&& fill) {
    if (size() < 8) {
      Status s = fill();
      if (!s.ok() && size() == 0) return s;
    }
    return std::span<const uint8_t>(buffer_.get() + begin_, size());
  }

  void Consume(size_t n) {
    TESSERA_CHECK(n <= size()) << n << " > " << size();
    begin_ += n;
    consumed_ += n;
  }

  // Moves the checked tail (fewer than 8 bytes) to the front, at the address its
  // stream offset's alignment asks, so the next record lands right after it.
  void Compact() {
    const size_t tail = size();
    const size_t begin = static_cast<size_t>(consumed_ % 8);
    if (begin_ == begin) return;
    std::memmove(buffer_.get() + begin, buffer_.get() + begin_, tail);
    begin_ = begin;
    end_ = begin + tail;
  }

  // Where the next bytes go, and how many fit; Commit(n) makes n of them checked.
  uint8_t* tail() { return buffer_.get() + end_; }
  size_t room() const { return capacity_ - end_; }
  void Commit(size_t n) {
    TESSERA_CHECK(n <= room()) << n << " > " << room();
    end_ += n;
  }

 private:
  size_t capacity_;
  std::unique_ptr<uint8_t[]> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  uint64_t consumed_ = 0;  // checked bytes consumed (the stream offset)
};

}  // namespace tessera::comm
