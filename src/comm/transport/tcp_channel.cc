#include "comm/transport/tcp_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace tessera::comm {
namespace {

constexpr size_t kStagingBytes = size_t{256} << 10;

}  // namespace

TcpChannel::TcpChannel(std::vector<UniqueFd> fds, size_t stripe_bytes, std::string peer_address)
    : fds_(std::move(fds)),
      stripe_bytes_(std::max<size_t>(stripe_bytes, 4096)),
      peer_address_(std::move(peer_address)),
      staging_(std::make_unique<uint8_t[]>(kStagingBytes)) {}

std::string TcpChannel::Describe() const {
  return "tcp " + peer_address_ + " (x" + std::to_string(fds_.size()) + ")";
}

Status TcpChannel::ReadError(int err) const {
  if (err == 0) return UnavailableError("closed the connection");
  return UnavailableError(std::string("connection failed: ") + std::strerror(err));
}

Result<size_t> TcpChannel::Write(const void* data, size_t size) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  size_t written = 0;
  while (written < size) {
    int fd = fds_[StripeIndex(sent_)].get();
    size_t n = std::min(size - written, StripeLeft(sent_));
    ssize_t rc = ::send(fd, src + written, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      written += static_cast<size_t>(rc);
      sent_ += static_cast<uint64_t>(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return UnavailableError(std::string("connection failed while sending: ") +
                            std::strerror(errno));
  }
  return written;
}

Result<std::span<const uint8_t>> TcpChannel::Peek() {
  size_t have = staging_end_ - staging_begin_;
  if (have >= 8) return std::span<const uint8_t>(staging_.get() + staging_begin_, have);
  // Fewer than 8 bytes buffered: compact and read more so reducers see whole
  // elements. Buffer addresses keep the stream offset's alignment mod 8, so
  // elements delivered from the staging buffer are naturally aligned.
  const size_t shift = static_cast<size_t>(received_ % 8);
  if (staging_begin_ != shift) {
    std::memmove(staging_.get() + shift, staging_.get() + staging_begin_, have);
    staging_begin_ = shift;
    staging_end_ = shift + have;
  }
  while (true) {
    uint64_t offset = received_ + (staging_end_ - staging_begin_);
    size_t n = std::min(kStagingBytes - staging_end_, StripeLeft(offset));
    ssize_t rc =
        ::recv(fds_[StripeIndex(offset)].get(), staging_.get() + staging_end_, n, MSG_DONTWAIT);
    if (rc > 0) {
      staging_end_ += static_cast<size_t>(rc);
      if (static_cast<size_t>(rc) == n && staging_end_ - staging_begin_ < 8) continue;
      break;
    }
    if (rc == 0) {
      // End of stream: what is buffered is still valid (the peer may have
      // finished and closed after sending it).
      if (staging_end_ > staging_begin_) break;
      return ReadError(0);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (staging_end_ > staging_begin_) break;
    return ReadError(errno);
  }
  return std::span<const uint8_t>(staging_.get() + staging_begin_, staging_end_ - staging_begin_);
}

void TcpChannel::Consume(size_t size) {
  staging_begin_ += size;
  received_ += size;
  if (staging_begin_ == staging_end_) staging_begin_ = staging_end_ = received_ % 8;
}

Result<size_t> TcpChannel::ReadInto(void* dst, size_t size) {
  if (staging_end_ > staging_begin_) {
    size_t n = std::min(size, staging_end_ - staging_begin_);
    std::memcpy(dst, staging_.get() + staging_begin_, n);
    Consume(n);
    return n;
  }
  uint8_t* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < size) {
    size_t n = std::min(size - done, StripeLeft(received_));
    ssize_t rc = ::recv(fds_[StripeIndex(received_)].get(), out + done, n, MSG_DONTWAIT);
    if (rc > 0) {
      done += static_cast<size_t>(rc);
      received_ += static_cast<uint64_t>(rc);
      continue;
    }
    if (rc == 0) return ReadError(0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return ReadError(errno);
  }
  return done;
}

void TcpChannel::AddPollFds(std::vector<pollfd>* fds, bool want_write) const {
  uint64_t next_in = received_ + (staging_end_ - staging_begin_);
  fds->push_back(pollfd{fds_[StripeIndex(next_in)].get(), POLLIN, 0});
  if (want_write) fds->push_back(pollfd{fds_[StripeIndex(sent_)].get(), POLLOUT, 0});
}

void TcpChannel::Shutdown() {
  for (auto& fd : fds_) ::shutdown(fd.get(), SHUT_RDWR);
}

}  // namespace tessera::comm
