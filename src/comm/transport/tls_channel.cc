#include "comm/transport/tls_channel.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "base/check.h"

namespace tessera::comm {
namespace {

constexpr size_t kMaxRecordPlaintext = size_t{16} << 10;  // TLS 1.3's limit
// Decrypted bytes buffered: a few records, so a large message is taken in pieces
// of about this size.
constexpr size_t kInCapacity = 4 * kMaxRecordPlaintext;
// Plaintext sealed by one SSL_write: what a Write may leave in out_ when the
// inner channel is full.
constexpr size_t kSealBytes = size_t{64} << 10;
constexpr unsigned char kPskIdentity[] = "tessera cluster-token session";
constexpr unsigned char kAes256GcmSha384[] = {0x13, 0x02};

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no OpenSSL error queued") : out;
}

}  // namespace

struct TlsChannel::Session {
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  std::array<uint8_t, 32> psk{};

  ~Session() {
    SSL_free(ssl);  // and its BIO
    SSL_CTX_free(ctx);
    OPENSSL_cleanse(psk.data(), psk.size());
  }

  // The external PSK as a resumable TLS 1.3 session of the one suite we offer.
  static SSL_SESSION* PskSession(SSL* ssl) {
    const auto* self = static_cast<const Session*>(SSL_get_app_data(ssl));
    const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kAes256GcmSha384);
    if (cipher == nullptr) return nullptr;
    SSL_SESSION* session = SSL_SESSION_new();
    if (session == nullptr) return nullptr;
    if (SSL_SESSION_set1_master_key(session, self->psk.data(), self->psk.size()) != 1 ||
        SSL_SESSION_set_cipher(session, cipher) != 1 ||
        SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION) != 1) {
      SSL_SESSION_free(session);
      return nullptr;
    }
    return session;
  }

  static int UsePsk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
                    SSL_SESSION** out) {
    SSL_SESSION* session = PskSession(ssl);
    if (session == nullptr) return 0;
    if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(session))) {
      SSL_SESSION_free(session);  // a retry for another suite's hash: no PSK for it
      *out = nullptr;
      return 1;
    }
    *id = kPskIdentity;
    *id_len = sizeof(kPskIdentity) - 1;
    *out = session;
    return 1;
  }

  static int FindPsk(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** out) {
    *out = nullptr;  // another identity: no PSK, and without a certificate no handshake
    if (id_len != sizeof(kPskIdentity) - 1 || std::memcmp(id, kPskIdentity, id_len) != 0) return 1;
    *out = PskSession(ssl);
    return *out != nullptr ? 1 : 0;
  }
};

// TLS reads and writes ciphertext through this BIO straight from and into the
// channel: reads come from the inner channel (a TCP channel receives into TLS's
// record buffer), writes append to out_, which Flush hands to the inner channel.
struct TlsChannel::ChannelBio {
  static TlsChannel* Of(BIO* bio) { return static_cast<TlsChannel*>(BIO_get_data(bio)); }

  static int Write(BIO* bio, const char* data, size_t size, size_t* written) {
    std::vector<uint8_t>& out = Of(bio)->out_;
    out.insert(out.end(), data, data + size);
    *written = size;
    return 1;
  }

  static int Read(BIO* bio, char* dst, size_t size, size_t* read) {
    BIO_clear_retry_flags(bio);
    TlsChannel* self = Of(bio);
    *read = 0;
    auto n = self->inner_->ReadInto(dst, size, false);
    if (!n.ok()) {
      self->inner_error_ = n.status();  // the peer's end, not a TLS failure
      return 0;
    }
    if (*n == 0) {
      BIO_set_retry_read(bio);
      return 0;
    }
    *read = *n;
    return 1;
  }

  static long Ctrl(BIO* /*bio*/, int cmd, long /*num*/, void* /*ptr*/) {
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
  }

  static const BIO_METHOD* Method() {
    static BIO_METHOD* method = [] {
      BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tessera channel");
      TESSERA_CHECK(m != nullptr && BIO_meth_set_write_ex(m, &Write) == 1 &&
                    BIO_meth_set_read_ex(m, &Read) == 1 && BIO_meth_set_ctrl(m, &Ctrl) == 1)
          << "OpenSSL BIO_meth_new failed";
      return m;
    }();
    return method;
  }
};

Result<std::unique_ptr<TlsChannel>> TlsChannel::Create(std::unique_ptr<Channel> inner,
                                                       const SessionKeys& keys, Role role) {
  auto session = std::make_unique<Session>();
  session->psk = keys.tls_psk;
  const std::string peer = inner->Describe();
  auto fail = [&](const char* what) {
    return InternalError(std::string("TLS setup for ") + peer + ": " + what + ": " +
                         OpenSslErrors());
  };
  session->ctx = SSL_CTX_new(TLS_method());
  if (session->ctx == nullptr) return fail("SSL_CTX_new");
  SSL_CTX* ctx = session->ctx;
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(ctx, "TLS_AES_256_GCM_SHA384") != 1 ||
      SSL_CTX_set1_groups_list(ctx, "X25519:P-256") != 1 || SSL_CTX_set_num_tickets(ctx, 0) != 1) {
    return fail("configuring TLS 1.3");
  }
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_clear_options(ctx, SSL_OP_ALLOW_NO_DHE_KEX);  // PSK with (EC)DHE only
  session->ssl = SSL_new(ctx);
  if (session->ssl == nullptr) return fail("SSL_new");
  // Whole records per read of the inner channel, not a header and a body.
  SSL_set_read_ahead(session->ssl, 1);
  SSL_set_app_data(session->ssl, session.get());
  if (role == Role::kClient) {
    SSL_set_psk_use_session_callback(session->ssl, &Session::UsePsk);
    SSL_set_connect_state(session->ssl);
  } else {
    SSL_set_psk_find_session_callback(session->ssl, &Session::FindPsk);
    SSL_set_accept_state(session->ssl);
  }
  std::unique_ptr<TlsChannel> channel(new TlsChannel(std::move(inner), std::move(session)));
  BIO* bio = BIO_new(ChannelBio::Method());
  if (bio == nullptr) return fail("BIO_new");
  BIO_set_data(bio, channel.get());
  BIO_set_init(bio, 1);
  SSL_set_bio(channel->session_->ssl, bio, bio);
  return channel;
}

TlsChannel::TlsChannel(std::unique_ptr<Channel> inner, std::unique_ptr<Session> session)
    : inner_(std::move(inner)), session_(std::move(session)), in_(kInCapacity) {}

TlsChannel::~TlsChannel() = default;

std::string TlsChannel::Describe() const { return inner_->Describe() + ", TLS 1.3"; }

std::string TlsChannel::Negotiated() const {
  if (!handshake_done_) return "";
  SSL* ssl = session_->ssl;
  std::string out = SSL_CIPHER_get_name(SSL_get_current_cipher(ssl));
  const int group = SSL_get_negotiated_group(ssl);
  const char* name = group != 0 ? SSL_group_to_name(ssl, group) : nullptr;
  out += ", ";
  out += name != nullptr ? name : "no key exchange";
  return out;
}

Status TlsChannel::Fail(Status status) {
  broken_ = status;
  return status;
}

Status TlsChannel::Flush() {
  while (out_sent_ < out_.size()) {
    TESSERA_ASSIGN_OR_RETURN(size_t n,
                             inner_->Write(out_.data() + out_sent_, out_.size() - out_sent_));
    if (n == 0) return Status::Ok();
    out_sent_ += n;
  }
  out_.clear();
  out_sent_ = 0;
  return Status::Ok();
}

Status TlsChannel::ReadFailure(int ssl_result, const char* what) {
  const int err = SSL_get_error(session_->ssl, ssl_result);
  if (!inner_error_.ok()) return Fail(inner_error_);
  if (err == SSL_ERROR_ZERO_RETURN) return Fail(UnavailableError("closed its TLS session"));
  return Fail(PermissionDeniedError(std::string(what) + ": " + OpenSslErrors()));
}

Result<bool> TlsChannel::StepHandshake() {
  if (!broken_.ok()) return broken_;
  if (!handshake_done_) {
    ERR_clear_error();
    const int r = SSL_do_handshake(session_->ssl);
    TESSERA_RETURN_IF_ERROR(Flush());
    if (r == 1) {
      handshake_done_ = true;
    } else if (SSL_get_error(session_->ssl, r) == SSL_ERROR_WANT_READ && inner_error_.ok()) {
      return false;
    } else {
      return ReadFailure(r, ("TLS handshake with " + inner_->Describe() +
                             " failed (TESSERA_TCP_TLS must be the same on every rank)")
                                .c_str());
    }
  }
  TESSERA_RETURN_IF_ERROR(Flush());
  return out_.empty();
}

Result<size_t> TlsChannel::Write(const void* data, size_t size) {
  if (!broken_.ok()) return broken_;
  TESSERA_RETURN_IF_ERROR(Flush());
  if (!out_.empty()) return size_t{0};
  // Bytes sealed by an earlier call are gone now: the caller offers them first.
  size_t accepted = std::min(size, sealed_);
  sealed_ -= accepted;
  const uint8_t* src = static_cast<const uint8_t*>(data);
  while (accepted < size && sealed_ == 0) {
    const size_t want = std::min(size - accepted, kSealBytes);
    size_t written = 0;
    ERR_clear_error();
    if (SSL_write_ex(session_->ssl, src + accepted, want, &written) != 1) {
      return Fail(InternalError("TLS write to " + inner_->Describe() + ": " + OpenSslErrors()));
    }
    TESSERA_RETURN_IF_ERROR(Flush());
    if (!out_.empty()) {
      sealed_ = written;
      break;
    }
    accepted += written;
  }
  return accepted;
}

bool TlsChannel::HasRoom() const { return out_.empty() && inner_->HasRoom(); }

void TlsChannel::AddPollFds(std::vector<pollfd>* fds, bool want_write) const {
  inner_->AddPollFds(fds, want_write || !out_.empty());
}

Status TlsChannel::Fill() {
  if (!broken_.ok()) return broken_;
  in_.Compact();  // the decrypted tail to the front, the next records after it
  SSL* ssl = session_->ssl;
  for (;;) {
    const bool enough = in_.size() >= 8;
    const size_t room = in_.room();
    // Past 8 bytes, go on only through records already here, while they fit.
    if (enough && (room < kMaxRecordPlaintext || SSL_has_pending(ssl) == 0)) return Status::Ok();
    size_t got = 0;
    ERR_clear_error();
    const int r = SSL_read_ex(ssl, in_.tail(), room, &got);
    if (r == 1) {
      in_.Commit(got);
      continue;
    }
    if (SSL_get_error(ssl, r) == SSL_ERROR_WANT_READ && inner_error_.ok()) return Status::Ok();
    return ReadFailure(r,
                       "sent a TLS record that failed its check (tampered in transit, replayed, "
                       "or not TLS)");
  }
}

Result<std::span<const uint8_t>> TlsChannel::Peek() {
  return in_.Peek([this] { return Fill(); });
}

Status CompleteTlsHandshakes(std::span<TlsChannel* const> channels, Deadline deadline) {
  for (;;) {
    std::vector<pollfd> fds;
    std::string pending;
    for (TlsChannel* channel : channels) {
      TESSERA_ASSIGN_OR_RETURN(bool done, channel->StepHandshake());
      if (done) continue;
      channel->AddPollFds(&fds, false);
      pending += (pending.empty() ? "" : ", ") + channel->Describe();
    }
    if (pending.empty()) return Status::Ok();
    if (deadline.Expired()) {
      return DeadlineExceededError("TLS handshakes did not finish in time with " + pending);
    }
    // Short naps cover a channel that holds bytes back (emulated link delay).
    const int left = deadline.RemainingMsForPoll();
    ::poll(fds.data(), fds.size(), left < 0 ? 20 : std::min(left, 20));
  }
}

}  // namespace tessera::comm
