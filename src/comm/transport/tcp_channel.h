// TcpChannel: the byte stream to a peer on another host over several TCP
// connections (TCP_NODELAY). The stream is striped: byte offset o travels on
// connection (o / stripe_bytes) % n, so a large message fills every connection
// while a small one uses one. DelayedChannel wraps a TcpChannel to emulate a
// link's one-way latency (TESSERA_TCP_DELAY_US; tests and benchmarks only).
// Layer: comm. Not thread-safe: one communicator thread drives each channel.
#pragma once

#include <memory>
#include <vector>

#include "base/unique_fd.h"
#include "comm/transport/channel.h"

namespace tessera::comm {

class TcpChannel : public Channel {
 public:
  TcpChannel(std::vector<UniqueFd> fds, size_t stripe_bytes, std::string peer_address);

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override;
  Result<size_t> ReadInto(void* dst, size_t size, bool bypass_cache) override;
  void AddPollFds(std::vector<pollfd>* fds, bool want_write) const override;
  void Shutdown() override;
  std::string Describe() const override;

 private:
  Status ReadError(int err) const;
  size_t StripeIndex(uint64_t offset) const { return (offset / stripe_bytes_) % fds_.size(); }
  size_t StripeLeft(uint64_t offset) const { return stripe_bytes_ - offset % stripe_bytes_; }

  std::vector<UniqueFd> fds_;
  size_t stripe_bytes_;
  std::string peer_address_;
  uint64_t sent_ = 0;      // stream bytes written
  uint64_t received_ = 0;  // stream bytes taken out of the sockets
  std::unique_ptr<uint8_t[]> staging_;
  size_t staging_begin_ = 0;
  size_t staging_end_ = 0;
};

// DelayedChannel: emulates a link's one-way latency over another channel (a
// TcpChannel). Every Write becomes a chunk {magic "TSD1", length, release time =
// steady-clock now + delay} followed by its bytes; the reader holds each chunk
// until its release time, so a byte is readable no earlier than `delay` after it
// was written, while chunks written back to back pipeline (N small messages cost
// about delay + N x transfer time, not N x delay). Bandwidth is not shaped. The
// release time is the writer's clock, which is meaningful only when both ends
// share CLOCK_MONOTONIC (one host, e.g. network namespaces); the reader never
// holds a chunk longer than its own delay after it arrives, so skewed clocks
// cannot stall it. Both ends must use it (all ranks set the same delay). Chunks
// end on 8-byte boundaries of the stream (the messenger's frames do), so the
// Channel contract on whole elements holds.
class DelayedChannel : public Channel {
 public:
  DelayedChannel(std::unique_ptr<Channel> inner, int64_t delay_ns);

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override;
  Result<size_t> ReadInto(void* dst, size_t size, bool bypass_cache) override;
  void NotifyPeer() override { inner_->NotifyPeer(); }
  bool HasRoom() const override { return inner_->HasRoom(); }
  void AddPollFds(std::vector<pollfd>* fds, bool want_write) const override;
  int64_t HeldUntilNs() const override;
  void Shutdown() override { inner_->Shutdown(); }
  std::string Describe() const override;

 private:
  static constexpr size_t kChunkHeaderBytes = 16;
  // Parses chunk headers until a chunk with unread bytes is current; true when
  // its release time has passed.
  Result<bool> ReadyToRead();

  std::unique_ptr<Channel> inner_;
  int64_t delay_ns_;
  // Writer: the chunk being written.
  uint64_t data_sent_ = 0;  // payload bytes accepted (stream offset without chunk headers)
  uint64_t out_left_ = 0;   // bytes of the current chunk not yet accepted
  uint8_t out_header_[kChunkHeaderBytes];
  size_t out_header_sent_ = kChunkHeaderBytes;
  // Reader: the chunk being read.
  uint8_t in_header_[kChunkHeaderBytes];
  size_t in_header_have_ = 0;
  uint64_t in_left_ = 0;       // bytes of the current chunk not yet consumed
  int64_t in_release_ns_ = 0;  // when the current chunk becomes readable
  bool in_released_ = true;
};

}  // namespace tessera::comm
