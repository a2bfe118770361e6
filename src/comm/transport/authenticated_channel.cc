#include "comm/transport/authenticated_channel.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/check.h"

namespace tessera::comm {

using frame_auth::kMaxRecordBytes;

// Records up to this long go out in one write with their header.
constexpr size_t kCoalesceBytes = 16 << 10;
using frame_auth::kRecordHeaderBytes;
using frame_auth::kRecordMagic;
using frame_auth::kTagBytes;

// AES-256-GMAC under one key: the tag of (header without its tag, payload) with
// the record's sequence number as the GCM nonce. Each (key, sequence number) pair
// is used once: keys are fresh per connection and the number only grows.
class AuthenticatedChannel::Gmac {
 public:
  explicit Gmac(const std::array<uint8_t, 32>& key) : ctx_(EVP_CIPHER_CTX_new()) {
    TESSERA_CHECK(ctx_ != nullptr) << "OpenSSL EVP_CIPHER_CTX_new failed";
    TESSERA_CHECK(EVP_EncryptInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) == 1)
        << "OpenSSL AES-256-GCM initialisation failed";
  }
  ~Gmac() { EVP_CIPHER_CTX_free(ctx_); }
  Gmac(const Gmac&) = delete;
  Gmac& operator=(const Gmac&) = delete;

  void Tag(uint64_t seq, const uint8_t* header, const uint8_t* payload, size_t size,
           uint8_t tag[kTagBytes]) {
    uint8_t iv[12] = {0};
    std::memcpy(iv, &seq, 8);
    int len = 0;
    bool ok = EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) == 1 &&
              EVP_EncryptUpdate(ctx_, nullptr, &len, header, 16) == 1 &&
              (size == 0 ||
               EVP_EncryptUpdate(ctx_, nullptr, &len, payload, static_cast<int>(size)) == 1) &&
              EVP_EncryptFinal_ex(ctx_, nullptr, &len) == 1 &&
              EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
    TESSERA_CHECK(ok) << "OpenSSL AES-256-GMAC failed";
  }

 private:
  EVP_CIPHER_CTX* ctx_;
};

AuthenticatedChannel::AuthenticatedChannel(std::unique_ptr<Channel> inner, const SessionKeys& keys)
    : inner_(std::move(inner)),
      send_mac_(std::make_unique<Gmac>(keys.send)),
      recv_mac_(std::make_unique<Gmac>(keys.recv)),
      out_small_(std::make_unique<uint8_t[]>(kRecordHeaderBytes + kCoalesceBytes)),
      in_(kMaxRecordBytes) {}

AuthenticatedChannel::~AuthenticatedChannel() = default;

std::string AuthenticatedChannel::Describe() const {
  return inner_->Describe() + ", frames authenticated";
}

Result<size_t> AuthenticatedChannel::Write(const void* data, size_t size) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  size_t accepted = 0;
  while (accepted < size) {
    if (out_left_ == 0 && out_header_sent_ == kRecordHeaderBytes) {
      // A new record of the bytes offered now, MACed before any goes out.
      const size_t length = std::min(size - accepted, kMaxRecordBytes);
      const uint32_t magic = kRecordMagic;
      const uint32_t length32 = static_cast<uint32_t>(length);
      std::memcpy(out_header_, &magic, 4);
      std::memcpy(out_header_ + 4, &length32, 4);
      std::memcpy(out_header_ + 8, &send_seq_, 8);
      send_mac_->Tag(send_seq_, out_header_, src + accepted, length, out_header_ + 16);
      ++send_seq_;
      out_left_ = length;
      out_header_sent_ = 0;
      if (length <= kCoalesceBytes) {
        // Small: header and payload in one write (one segment, one wakeup).
        std::memcpy(out_small_.get(), out_header_, kRecordHeaderBytes);
        std::memcpy(out_small_.get() + kRecordHeaderBytes, src + accepted, length);
        TESSERA_ASSIGN_OR_RETURN(size_t n,
                                 inner_->Write(out_small_.get(), kRecordHeaderBytes + length));
        out_header_sent_ = std::min(n, kRecordHeaderBytes);
        if (n < kRecordHeaderBytes) return accepted;
        n -= kRecordHeaderBytes;
        accepted += n;
        out_left_ -= n;
        if (out_left_ > 0) break;
        continue;
      }
    }
    while (out_header_sent_ < kRecordHeaderBytes) {
      TESSERA_ASSIGN_OR_RETURN(size_t n, inner_->Write(out_header_ + out_header_sent_,
                                                       kRecordHeaderBytes - out_header_sent_));
      if (n == 0) return accepted;
      out_header_sent_ += n;
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - accepted, out_left_));
    TESSERA_ASSIGN_OR_RETURN(size_t n, inner_->Write(src + accepted, want));
    accepted += n;
    out_left_ -= n;
    if (n < want) break;
  }
  return accepted;
}

Result<size_t> AuthenticatedChannel::Pull(uint8_t* dst, size_t size) {
  // Large: straight from the socket into place. Small: from the inner channel's
  // buffer, which one read fills with many small records (one system call).
  if (size >= kCoalesceBytes) return inner_->ReadInto(dst, size, false);
  TESSERA_ASSIGN_OR_RETURN(auto span, inner_->Peek());
  const size_t n = std::min(size, span.size());
  if (n > 0) {
    std::memcpy(dst, span.data(), n);
    inner_->Consume(n);
  }
  return n;
}

Status AuthenticatedChannel::Fail(Status status) {
  broken_ = status;
  return status;
}

Status AuthenticatedChannel::Fill() {
  if (!broken_.ok()) return broken_;
  while (in_.size() < 8) {
    if (in_length_ == 0) {
      // Between records: the checked tail to the front, the next record after it.
      if (in_header_have_ == 0) in_.Compact();
      auto n = Pull(in_header_ + in_header_have_, kRecordHeaderBytes - in_header_have_);
      if (!n.ok()) {
        if (in_header_have_ == 0) return n.status();  // between records: the inner error
        return Fail(
            UnavailableError("connection ended inside an authenticated frame header "
                             "(truncated): " +
                             n.status().message()));
      }
      if (*n == 0) return Status::Ok();
      in_header_have_ += *n;
      if (in_header_have_ < kRecordHeaderBytes) continue;
      uint32_t magic = 0;
      uint32_t length = 0;
      uint64_t seq = 0;
      std::memcpy(&magic, in_header_, 4);
      std::memcpy(&length, in_header_ + 4, 4);
      std::memcpy(&seq, in_header_ + 8, 8);
      if (magic != kRecordMagic) {
        return Fail(PermissionDeniedError(
            "sent a frame without per-frame authentication (bad record magic 0x" +
            [&] {
              char b[9];
              std::snprintf(b, sizeof(b), "%08x", magic);
              return std::string(b);
            }() +
            "; TESSERA_TCP_FRAME_AUTH must be the same on every rank)"));
      }
      if (length == 0 || length > kMaxRecordBytes) {
        return Fail(PermissionDeniedError("sent an authenticated frame of impossible length " +
                                          std::to_string(length) + " (at most " +
                                          std::to_string(kMaxRecordBytes) + ")"));
      }
      if (seq != recv_seq_) {
        return Fail(PermissionDeniedError("sent authenticated frame number " + std::to_string(seq) +
                                          " where " + std::to_string(recv_seq_) +
                                          " was due (a replayed, reordered or dropped frame)"));
      }
      in_length_ = length;
      in_have_ = 0;
    }
    // The record's payload goes right after the checked bytes.
    uint8_t* dst = in_.tail();
    auto n = Pull(dst + in_have_, in_length_ - in_have_);
    if (!n.ok()) {
      return Fail(UnavailableError("connection ended inside authenticated frame " +
                                   std::to_string(recv_seq_) + " (truncated, " +
                                   std::to_string(in_have_) + " of " + std::to_string(in_length_) +
                                   " bytes): " + n.status().message()));
    }
    if (*n == 0) return Status::Ok();
    in_have_ += *n;
    if (in_have_ < in_length_) continue;
    // Whole: check the tag while the bytes are still in the cache.
    uint8_t expected[kTagBytes];
    recv_mac_->Tag(recv_seq_, in_header_, dst, in_length_, expected);
    if (CRYPTO_memcmp(expected, in_header_ + 16, kTagBytes) != 0) {
      return Fail(PermissionDeniedError(
          "sent authenticated frame " + std::to_string(recv_seq_) +
          " with a wrong MAC (tampered in transit, or sent under another session key)"));
    }
    ++recv_seq_;
    in_.Commit(in_length_);
    in_length_ = 0;
    in_have_ = 0;
    in_header_have_ = 0;
  }
  return Status::Ok();
}

Result<std::span<const uint8_t>> AuthenticatedChannel::Peek() {
  return in_.Peek([this] { return Fill(); });
}

void AuthenticatedChannel::AddPollFds(std::vector<pollfd>* fds, bool want_write) const {
  inner_->AddPollFds(fds, want_write);
}

}  // namespace tessera::comm
