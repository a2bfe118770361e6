#include "comm/transport/tcp_channel.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/clock.h"

namespace tessera::comm {
namespace {

constexpr size_t kStagingBytes = size_t{256} << 10;
constexpr uint32_t kDelayChunkMagic = 0x31445354;          // "TSD1"
constexpr uint64_t kMaxDelayChunkBytes = size_t{1} << 20;  // a multiple of 8

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

Result<size_t> TcpChannel::ReadInto(void* dst, size_t size, bool /*bypass_cache*/) {
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
    // End of stream or a failure: the bytes received before it are still the
    // peer's; the next call reports it.
    if (rc == 0) return done > 0 ? Result<size_t>(done) : ReadError(0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return done > 0 ? Result<size_t>(done) : ReadError(errno);
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

DelayedChannel::DelayedChannel(std::unique_ptr<Channel> inner, int64_t delay_ns)
    : inner_(std::move(inner)), delay_ns_(delay_ns) {}

std::string DelayedChannel::Describe() const {
  return inner_->Describe() + ", delay " + std::to_string(delay_ns_ / 1000) + " us";
}

Result<size_t> DelayedChannel::Write(const void* data, size_t size) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  size_t accepted = 0;
  while (accepted < size) {
    if (out_left_ == 0) {
      // A new chunk, stamped now. It ends on an 8-byte boundary of the stream:
      // the messenger pads every frame to 8 bytes, so the bytes to get there will
      // be written (by later calls if not by this one).
      uint64_t end = data_sent_ + std::min<uint64_t>(size - accepted, kMaxDelayChunkBytes);
      end = (end + 7) & ~uint64_t{7};
      out_left_ = end - data_sent_;
      const uint32_t magic = kDelayChunkMagic;
      const uint32_t length = static_cast<uint32_t>(out_left_);
      const int64_t release_ns = NowNs() + delay_ns_;
      std::memcpy(out_header_, &magic, 4);
      std::memcpy(out_header_ + 4, &length, 4);
      std::memcpy(out_header_ + 8, &release_ns, 8);
      out_header_sent_ = 0;
    }
    while (out_header_sent_ < kChunkHeaderBytes) {
      TESSERA_ASSIGN_OR_RETURN(size_t n, inner_->Write(out_header_ + out_header_sent_,
                                                       kChunkHeaderBytes - out_header_sent_));
      if (n == 0) return accepted;
      out_header_sent_ += n;
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - accepted, out_left_));
    TESSERA_ASSIGN_OR_RETURN(size_t n, inner_->Write(src + accepted, want));
    accepted += n;
    data_sent_ += n;
    out_left_ -= n;
    if (n < want) break;
  }
  return accepted;
}

Result<bool> DelayedChannel::ReadyToRead() {
  while (in_left_ == 0) {
    TESSERA_ASSIGN_OR_RETURN(auto span, inner_->Peek());
    if (span.empty()) return false;
    const size_t n = std::min(span.size(), kChunkHeaderBytes - in_header_have_);
    std::memcpy(in_header_ + in_header_have_, span.data(), n);
    inner_->Consume(n);
    in_header_have_ += n;
    if (in_header_have_ < kChunkHeaderBytes) continue;
    in_header_have_ = 0;
    uint32_t magic = 0;
    uint32_t length = 0;
    int64_t release_ns = 0;
    std::memcpy(&magic, in_header_, 4);
    std::memcpy(&length, in_header_ + 4, 4);
    std::memcpy(&release_ns, in_header_ + 8, 8);
    if (magic != kDelayChunkMagic || length == 0 || length % 8 != 0) {
      return InvalidArgumentError(
          "sent data without the emulated-delay framing (TESSERA_TCP_DELAY_US must be the same "
          "on every rank)");
    }
    const int64_t now = NowNs();
    in_left_ = length;
    // Never hold longer than our own delay after arrival (clocks of other hosts).
    in_release_ns_ = std::min(release_ns, now + delay_ns_);
    in_released_ = in_release_ns_ <= now;
  }
  if (!in_released_ && NowNs() >= in_release_ns_) in_released_ = true;
  return in_released_;
}

Result<std::span<const uint8_t>> DelayedChannel::Peek() {
  TESSERA_ASSIGN_OR_RETURN(bool ready, ReadyToRead());
  if (!ready) return std::span<const uint8_t>();
  TESSERA_ASSIGN_OR_RETURN(auto span, inner_->Peek());
  return span.first(static_cast<size_t>(std::min<uint64_t>(span.size(), in_left_)));
}

void DelayedChannel::Consume(size_t size) {
  TESSERA_CHECK(size <= in_left_) << size << " > " << in_left_;
  inner_->Consume(size);
  in_left_ -= size;
}

Result<size_t> DelayedChannel::ReadInto(void* dst, size_t size, bool bypass_cache) {
  TESSERA_ASSIGN_OR_RETURN(bool ready, ReadyToRead());
  if (!ready) return size_t{0};
  TESSERA_ASSIGN_OR_RETURN(
      size_t n,
      inner_->ReadInto(dst, static_cast<size_t>(std::min<uint64_t>(size, in_left_)), bypass_cache));
  in_left_ -= n;
  return n;
}

int64_t DelayedChannel::HeldUntilNs() const {
  return in_left_ > 0 && !in_released_ ? in_release_ns_ : 0;
}

void DelayedChannel::AddPollFds(std::vector<pollfd>* fds, bool want_write) const {
  const size_t first = fds->size();
  inner_->AddPollFds(fds, want_write);
  // Held bytes are already readable in the socket: polling for them would wake
  // at once. The sleeper's timeout ends at HeldUntilNs() instead.
  if (HeldUntilNs() != 0) {
    for (size_t i = first; i < fds->size(); ++i) (*fds)[i].events &= ~POLLIN;
  }
}

}  // namespace tessera::comm
