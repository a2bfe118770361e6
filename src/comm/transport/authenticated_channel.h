// AuthenticatedChannel: per-frame authentication of a TCP byte stream after the
// cluster-token handshake (auth.h). Every Write becomes one or more records
// {magic "TSF1", length (4 bytes), sequence number (8 bytes), tag (16 bytes)}
// followed by `length` payload bytes. The tag is AES-256-GMAC (AES-GCM with the
// header and payload as associated data, OpenSSL) under this direction's session
// key, with the sequence number as the nonce; the reader expects sequence numbers
// 0, 1, 2... and hands out no byte of a record before its tag checks, so a
// tampered, replayed, reordered, truncated or foreign (other key) record is an
// error for that peer, never data. Layer: comm. Not thread-safe: one communicator
// thread drives each channel.
//
// The writer MACs a record's payload when it starts it, from the caller's bytes,
// before the bytes go to the socket: a caller that is told only part of a Write was
// accepted must offer the same stream bytes again (the messenger does: its frames
// are fixed once queued). The tag travels in the header so that nothing is left to
// send after the last payload byte is accepted.
#pragma once

#include <array>
#include <memory>

#include "comm/rendezvous/auth.h"
#include "comm/transport/channel.h"
#include "comm/transport/checked_bytes.h"

namespace tessera::comm {

namespace frame_auth {
inline constexpr uint32_t kRecordMagic = 0x31465354;  // "TSF1"
inline constexpr size_t kRecordHeaderBytes = 32;
inline constexpr size_t kTagBytes = 16;
// Largest payload of one record: the reader buffers a whole record before it
// checks it (64 KiB stays in the L2 cache between the MAC and the copy out).
inline constexpr size_t kMaxRecordBytes = size_t{64} << 10;
}  // namespace frame_auth

class AuthenticatedChannel : public Channel {
 public:
  AuthenticatedChannel(std::unique_ptr<Channel> inner, const SessionKeys& keys);
  ~AuthenticatedChannel() override;

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override { in_.Consume(size); }
  void NotifyPeer() override { inner_->NotifyPeer(); }
  bool HasRoom() const override { return inner_->HasRoom(); }
  void AddPollFds(std::vector<pollfd>* fds, bool want_write) const override;
  int64_t HeldUntilNs() const override { return inner_->HeldUntilNs(); }
  void Shutdown() override { inner_->Shutdown(); }
  std::string Describe() const override;

 private:
  class Gmac;
  // Reads and checks records until at least 8 checked bytes are buffered or no
  // more bytes have arrived.
  Status Fill();
  Status Fail(Status status);
  // Up to `size` bytes of the inner stream into `dst` (0 when none have arrived).
  Result<size_t> Pull(uint8_t* dst, size_t size);

  std::unique_ptr<Channel> inner_;
  std::unique_ptr<Gmac> send_mac_;
  std::unique_ptr<Gmac> recv_mac_;
  // Writer: the record being written.
  uint64_t send_seq_ = 0;
  uint64_t out_left_ = 0;  // payload bytes of the current record not yet accepted
  uint8_t out_header_[frame_auth::kRecordHeaderBytes];
  size_t out_header_sent_ = frame_auth::kRecordHeaderBytes;
  std::unique_ptr<uint8_t[]> out_small_;  // header + payload of a small record
  // Reader: the checked bytes, and the record being received right after them.
  uint64_t recv_seq_ = 0;
  CheckedBytes in_;
  uint8_t in_header_[frame_auth::kRecordHeaderBytes];
  size_t in_header_have_ = 0;
  size_t in_length_ = 0;  // payload bytes of the record being received (0: header next)
  size_t in_have_ = 0;    // of which arrived
  Status broken_;         // sticky: once a record failed, the stream is dead
};

}  // namespace tessera::comm
