#include "comm/rendezvous/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/net_util.h"

namespace tessera::comm {
namespace {

constexpr std::array<uint8_t, 4> kMagic = {'T', 'S', 'A', '1'};
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

Mac ComputeMac(std::string_view token, std::string_view role, const Nonce& first,
               const Nonce& second) {
  std::string message(role);
  message.append(reinterpret_cast<const char*>(first.data()), first.size());
  message.append(reinterpret_cast<const char*>(second.data()), second.size());
  Mac mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  return mac;
}

std::array<uint8_t, 32> Hmac(const uint8_t* key, size_t key_bytes, std::string_view message) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key, static_cast<int>(key_bytes),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len);
  return out;
}

Status RandomNonce(Nonce* nonce) {
  if (RAND_bytes(nonce->data(), static_cast<int>(nonce->size())) != 1) {
    return InternalError("OpenSSL RAND_bytes failed");
  }
  return Status::Ok();
}

}  // namespace

SessionKeys DeriveClientSessionKeys(std::string_view token, const uint8_t server_nonce[32],
                                    const uint8_t client_nonce[32]) {
  // Extract: a pseudorandom key from the token, salted with both nonces (a fresh
  // salt per connection, so no two connections share keys).
  uint8_t salt[2 * kNonceBytes];
  std::memcpy(salt, server_nonce, kNonceBytes);
  std::memcpy(salt + kNonceBytes, client_nonce, kNonceBytes);
  const std::array<uint8_t, 32> prk = Hmac(salt, sizeof(salt), token);
  // Expand: one key per direction, so a frame cannot be reflected back to its sender.
  SessionKeys keys;
  keys.send = Hmac(prk.data(), prk.size(), std::string_view("tessera frames client->server\x01"));
  keys.recv = Hmac(prk.data(), prk.size(), std::string_view("tessera frames server->client\x01"));
  keys.tls_psk = Hmac(prk.data(), prk.size(), std::string_view("tessera tls 1.3 psk\x01"));
  OPENSSL_cleanse(salt, sizeof(salt));
  return keys;
}

Status AuthenticateAsServer(int fd, std::string_view token, Deadline deadline, SessionKeys* keys) {
  Nonce server_nonce;
  TESSERA_RETURN_IF_ERROR(RandomNonce(&server_nonce));
  uint8_t hello[kMagic.size() + kNonceBytes];
  std::memcpy(hello, kMagic.data(), kMagic.size());
  std::memcpy(hello + kMagic.size(), server_nonce.data(), kNonceBytes);
  TESSERA_RETURN_IF_ERROR(WriteFull(fd, hello, sizeof(hello), deadline));

  Nonce client_nonce;
  Mac client_mac;
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, client_nonce.data(), kNonceBytes, deadline));
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, client_mac.data(), kMacBytes, deadline));
  Mac expected = ComputeMac(token, "client", server_nonce, client_nonce);
  if (CRYPTO_memcmp(expected.data(), client_mac.data(), kMacBytes) != 0) {
    uint8_t refused = 0;
    (void)WriteFull(fd, &refused, 1, deadline);
    return PermissionDeniedError("peer " + SocketPeerAddress(fd) +
                                 " failed cluster-token authentication");
  }
  uint8_t reply[1 + kMacBytes];
  reply[0] = 1;
  Mac server_mac = ComputeMac(token, "server", client_nonce, server_nonce);
  std::memcpy(reply + 1, server_mac.data(), kMacBytes);
  TESSERA_RETURN_IF_ERROR(WriteFull(fd, reply, sizeof(reply), deadline));
  if (keys != nullptr) {
    SessionKeys client = DeriveClientSessionKeys(token, server_nonce.data(), client_nonce.data());
    keys->send = client.recv;
    keys->recv = client.send;
    keys->tls_psk = client.tls_psk;
  }
  return Status::Ok();
}

Status AuthenticateAsClient(int fd, std::string_view token, Deadline deadline, SessionKeys* keys) {
  uint8_t hello[kMagic.size() + kNonceBytes];
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, hello, sizeof(hello), deadline));
  if (std::memcmp(hello, kMagic.data(), kMagic.size()) != 0) {
    return PermissionDeniedError(SocketPeerAddress(fd) +
                                 " is not a tessera endpoint (bad greeting)");
  }
  Nonce server_nonce;
  std::memcpy(server_nonce.data(), hello + kMagic.size(), kNonceBytes);
  Nonce client_nonce;
  TESSERA_RETURN_IF_ERROR(RandomNonce(&client_nonce));
  Mac mac = ComputeMac(token, "client", server_nonce, client_nonce);
  uint8_t answer[kNonceBytes + kMacBytes];
  std::memcpy(answer, client_nonce.data(), kNonceBytes);
  std::memcpy(answer + kNonceBytes, mac.data(), kMacBytes);
  TESSERA_RETURN_IF_ERROR(WriteFull(fd, answer, sizeof(answer), deadline));

  uint8_t verdict = 0;
  Status read = ReadFull(fd, &verdict, 1, deadline);
  if (!read.ok() || verdict != 1) {
    return PermissionDeniedError(SocketPeerAddress(fd) +
                                 " rejected our cluster token (TESSERA_CLUSTER_TOKEN differs)");
  }
  Mac server_mac;
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, server_mac.data(), kMacBytes, deadline));
  Mac expected = ComputeMac(token, "server", client_nonce, server_nonce);
  if (CRYPTO_memcmp(expected.data(), server_mac.data(), kMacBytes) != 0) {
    return PermissionDeniedError(SocketPeerAddress(fd) +
                                 " could not prove that it knows the cluster token");
  }
  if (keys != nullptr) {
    *keys = DeriveClientSessionKeys(token, server_nonce.data(), client_nonce.data());
  }
  return Status::Ok();
}

}  // namespace tessera::comm
