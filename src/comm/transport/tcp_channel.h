// TcpChannel: the byte stream to a peer on another host over several TCP
// connections (TCP_NODELAY). The stream is striped: byte offset o travels on
// connection (o / stripe_bytes) % n, so a large message fills every connection
// while a small one uses one. Layer: comm. Not thread-safe: one communicator
// thread drives it.
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
  Result<size_t> ReadInto(void* dst, size_t size) override;
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

}  // namespace tessera::comm
