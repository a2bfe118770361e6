// TlsChannel: TLS 1.3 (OpenSSL) over a TCP byte stream, for jobs whose traffic
// between hosts must stay secret (TESSERA_TCP_TLS=1, `--tls`). It replaces
// AuthenticatedChannel on a connection: TLS records are encrypted and
// authenticated (AES-256-GCM) and numbered, so the guarantees of per-frame
// authentication hold and a reader on the path sees only ciphertext.
//
// No certificates: both ends have already proved the cluster token to each other
// (auth.h), and that handshake's fresh per-connection secret becomes TLS's
// external pre-shared key (SessionKeys::tls_psk). The key exchange mode is
// psk_dhe_ke, so an ephemeral X25519 exchange keys the session: traffic recorded
// today stays secret even if the token leaks later (forward secrecy), which the
// token-derived frame keys alone cannot give.
//
// The handshake runs once, before the messenger uses the channel
// (CompleteTlsHandshakes). Write keeps the Channel contract of a byte stream
// whose caller re-offers unaccepted bytes: bytes count as accepted only once all
// the records that carry them are in the inner channel; until then they wait,
// sealed, in this channel and Write reports them when the caller offers them
// again. Peek hands out decrypted bytes only (a record is checked before any of
// it is used) at addresses that keep the stream offset's alignment mod 8.
// Layer: comm. Not thread-safe: one communicator thread drives each channel.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "base/clock.h"
#include "comm/rendezvous/auth.h"
#include "comm/transport/channel.h"
#include "comm/transport/checked_bytes.h"

namespace tessera::comm {

class TlsChannel : public Channel {
 public:
  // The end that connected is the TLS client.
  enum class Role { kClient, kServer };

  static Result<std::unique_ptr<TlsChannel>> Create(std::unique_ptr<Channel> inner,
                                                    const SessionKeys& keys, Role role);
  ~TlsChannel() override;

  // Advances the handshake without blocking; true once it is done and all of
  // this end's handshake bytes are in the inner channel.
  Result<bool> StepHandshake();
  // The negotiated suite and key-exchange group, e.g. "TLS_AES_256_GCM_SHA384,
  // X25519" (empty before the handshake).
  std::string Negotiated() const;

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override { in_.Consume(size); }
  void NotifyPeer() override { inner_->NotifyPeer(); }
  bool HasRoom() const override;
  void AddPollFds(std::vector<pollfd>* fds, bool want_write) const override;
  int64_t HeldUntilNs() const override { return inner_->HeldUntilNs(); }
  void Shutdown() override { inner_->Shutdown(); }
  std::string Describe() const override;

 private:
  struct Session;
  struct ChannelBio;
  TlsChannel(std::unique_ptr<Channel> inner, std::unique_ptr<Session> session);
  // Hands the records in out_ to the inner channel as far as it accepts.
  Status Flush();
  // The error of a failed SSL call that read: the inner channel's own (a dead
  // peer) or TLS's (PermissionDenied: `what`, OpenSSL's reasons).
  Status ReadFailure(int ssl_result, const char* what);
  // Decrypts records until at least 8 bytes are ready or no more have arrived.
  Status Fill();
  Status Fail(Status status);

  std::unique_ptr<Channel> inner_;
  std::unique_ptr<Session> session_;
  bool handshake_done_ = false;
  // Writer: records (TLS writes them here) not yet taken by the inner channel, and how many
  // plaintext bytes they carry (accepted when the caller offers them again after a flush).
  std::vector<uint8_t> out_;
  size_t out_sent_ = 0;
  size_t sealed_ = 0;
  CheckedBytes in_;     // reader: decrypted bytes, and room for the next records
  Status inner_error_;  // what the inner channel reported to a TLS read
  Status broken_;       // sticky: once a record failed, the stream is dead
};

// Runs the handshakes of `channels` side by side (each end of every connection
// must be in one such call) until all are done; DeadlineExceeded naming the
// peers still pending once `deadline` passes.
Status CompleteTlsHandshakes(std::span<TlsChannel* const> channels, Deadline deadline);

}  // namespace tessera::comm
