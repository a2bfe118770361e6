// Cluster-token authentication of a fresh connection: a mutual HMAC-SHA256
// challenge/response (OpenSSL), run by the store and by the TCP transport before
// any other byte is trusted. The token itself never crosses the wire. Both ends
// also derive per-direction session keys from the token and both nonces
// (HKDF-style, HMAC-SHA256): the TCP transport authenticates every later frame with
// them (authenticated_channel.h). Layer: comm. Stateless; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace tessera::comm {

// Keys of one authenticated connection: `send` MACs what this end writes, `recv`
// checks what it reads (the peer's `send`). Fresh per connection (both nonces).
// `tls_psk`, the same at both ends, is the external pre-shared key of a TLS 1.3
// session over the connection (transport/tls_channel.h).
struct SessionKeys {
  std::array<uint8_t, 32> send{};
  std::array<uint8_t, 32> recv{};
  std::array<uint8_t, 32> tls_psk{};
};

// Server side (the accepting end). PermissionDenied when the client does not
// know the token; the connection should then be closed.
// `keys`, when given, receives the session keys.
Status AuthenticateAsServer(int fd, std::string_view token, Deadline deadline,
                            SessionKeys* keys = nullptr);
// Client side (the connecting end). PermissionDenied when the server rejects us
// or cannot prove that it knows the token itself.
Status AuthenticateAsClient(int fd, std::string_view token, Deadline deadline,
                            SessionKeys* keys = nullptr);

// The derivation itself (exposed for tests and fuzzers): what the client of a
// handshake with these nonces gets; the server's keys are the same, swapped.
SessionKeys DeriveClientSessionKeys(std::string_view token, const uint8_t server_nonce[32],
                                    const uint8_t client_nonce[32]);

}  // namespace tessera::comm
