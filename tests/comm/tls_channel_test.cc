// TLS 1.3 on the TCP transport (TlsChannel): a handshake keyed by the token
// handshake's secret with an ephemeral X25519 exchange, a byte-exact stream under
// partial writes, no plaintext on the wire, and tampered, replayed, foreign-key and
// non-TLS traffic each a clear error (never data, a crash or a hang). The two ends
// talk through a relay this test controls: it sees, and may alter, every byte.
#include "comm/transport/tls_channel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "comm/transport/authenticated_channel.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

SessionKeys KeysWithPsk(uint8_t seed) {
  SessionKeys k;
  for (size_t i = 0; i < 32; ++i) k.tls_psk[i] = static_cast<uint8_t>(seed * 7 + i);
  return k;
}

std::unique_ptr<TlsChannel> Tls(UniqueFd fd, const SessionKeys& keys, TlsChannel::Role role) {
  auto channel = TlsChannel::Create(testing::TcpOver(std::move(fd)), keys, role);
  TESSERA_CHECK(channel.ok()) << channel.status().ToString();
  return std::move(*channel);
}

// Bytes the relay forwards; it may rewrite them (the man in the middle).
using Tamper = std::function<void(std::vector<uint8_t>*)>;

// A client and a server TlsChannel joined through a relay: client <-> [a] relay
// [b] <-> server. `wire` keeps everything the client sent.
struct TlsLink {
  UniqueFd relay_a, relay_b;
  std::unique_ptr<TlsChannel> client, server;
  std::vector<uint8_t> wire;
  Tamper client_to_server;  // applied to each batch of client bytes

  TlsLink(const SessionKeys& client_keys, const SessionKeys& server_keys) {
    auto [c, a] = testing::SocketPair();
    auto [b, s] = testing::SocketPair();
    relay_a = std::move(a);
    relay_b = std::move(b);
    client = Tls(std::move(c), client_keys, TlsChannel::Role::kClient);
    server = Tls(std::move(s), server_keys, TlsChannel::Role::kServer);
  }

  static void Move(int from, int to, std::vector<uint8_t>* log, const Tamper& tamper) {
    uint8_t buf[1 << 16];
    ssize_t n;
    while ((n = ::read(from, buf, sizeof(buf))) > 0) {
      std::vector<uint8_t> bytes(buf, buf + n);
      if (log != nullptr) log->insert(log->end(), bytes.begin(), bytes.end());
      if (tamper) tamper(&bytes);
      size_t done = 0;
      while (done < bytes.size()) {
        ssize_t w = ::write(to, bytes.data() + done, bytes.size() - done);
        if (w > 0) done += static_cast<size_t>(w);
      }
    }
  }
  void Relay() {
    Move(relay_a.get(), relay_b.get(), &wire, client_to_server);
    Move(relay_b.get(), relay_a.get(), nullptr, nullptr);
  }
  // Both handshakes to the end (or the first error).
  Status Handshake() {
    bool client_done = false, server_done = false;
    for (int i = 0; i < 1000 && !(client_done && server_done); ++i) {
      auto c = client->StepHandshake();
      if (!c.ok()) return c.status();
      auto s = server->StepHandshake();
      if (!s.ok()) return s.status();
      client_done = *c;
      server_done = *s;
      Relay();
    }
    return client_done && server_done ? Status::Ok() : InternalError("handshake did not finish");
  }
  // Writes all of `bytes` from the client, relaying as it goes.
  void Send(const std::vector<uint8_t>& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      auto n = client->Write(bytes.data() + done, bytes.size() - done);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      done += *n;
      Relay();
    }
    Relay();
  }
  // Up to `size` bytes at the server, or its error.
  Result<std::vector<uint8_t>> Receive(size_t size) {
    std::vector<uint8_t> got;
    for (int i = 0; i < 100 && got.size() < size; ++i) {
      auto span = server->Peek();
      if (!span.ok()) return span.status();
      const size_t n = std::min(span->size(), size - got.size());
      got.insert(got.end(), span->begin(), span->begin() + n);
      server->Consume(n);
      Relay();
    }
    return got;
  }
};

std::vector<uint8_t> Pattern(size_t n, const char* text) {
  std::vector<uint8_t> p(n);
  const size_t len = std::strlen(text);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(text[i % len]);
  return p;
}

TEST(TlsChannelTest, HandshakeNegotiatesAes256GcmWithAnEphemeralX25519Exchange) {
  TlsLink link(KeysWithPsk(1), KeysWithPsk(1));
  ASSERT_OK(link.Handshake());
  const std::string suite = link.client->Negotiated();
  EXPECT_NE(suite.find("TLS_AES_256_GCM_SHA384"), std::string::npos) << suite;
  EXPECT_NE(suite.find("25519"), std::string::npos) << suite;  // psk_dhe_ke: forward secrecy
  EXPECT_EQ(link.server->Negotiated(), suite);
  EXPECT_NE(link.client->Describe().find("TLS 1.3"), std::string::npos);
}

TEST(TlsChannelTest, StreamRoundTripsByteExactThroughPartialWrites) {
  // Socket buffers fill, so writes are taken in pieces; the reader sees aligned,
  // whole 8-byte elements, as the Channel contract asks.
  auto [a, b] = testing::SocketPair();
  auto writer = Tls(std::move(a), KeysWithPsk(2), TlsChannel::Role::kClient);
  auto reader = Tls(std::move(b), KeysWithPsk(2), TlsChannel::Role::kServer);
  TlsChannel* both[] = {writer.get(), reader.get()};
  ASSERT_OK(CompleteTlsHandshakes(both, Deadline::AfterMs(5000)));
  std::mt19937 rng(1);
  std::vector<uint8_t> sent(3 << 20);
  for (auto& x : sent) x = static_cast<uint8_t>(rng());
  std::vector<uint8_t> got(sent.size());
  size_t written = 0, read = 0;
  while (read < sent.size()) {
    if (written < sent.size()) {
      size_t want = std::min<size_t>(sent.size() - written, 1 + rng() % 200'000);
      auto n = writer->Write(sent.data() + written, want);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      written += *n;
    }
    if (rng() % 2 == 0) {
      auto span = reader->Peek();
      ASSERT_TRUE(span.ok()) << span.status().ToString();
      if (span->empty()) continue;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(span->data()) % 8, read % 8);
      if (sent.size() - read - span->size() >= 8 && span->size() < 8) {
        ASSERT_EQ((read + span->size()) % 8, 0u) << "a partial element at " << read;
      }
      size_t n = std::min<size_t>(span->size(), 1 + rng() % 70'000);
      std::memcpy(got.data() + read, span->data(), n);
      reader->Consume(n);
      read += n;
    } else {
      auto n =
          reader->ReadInto(got.data() + read, std::min<size_t>(sent.size() - read, 100'000), false);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      read += *n;
    }
  }
  EXPECT_EQ(got, sent);
}

TEST(TlsChannelTest, WireCarriesNoPlaintext) {
  TlsLink link(KeysWithPsk(3), KeysWithPsk(3));
  ASSERT_OK(link.Handshake());
  const auto secret = Pattern(100'000, "activations of layer 7: ");
  link.Send(secret);
  auto got = link.Receive(secret.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, secret);
  const std::string needle = "layer 7";
  EXPECT_EQ(std::search(link.wire.begin(), link.wire.end(), needle.begin(), needle.end()),
            link.wire.end());
  EXPECT_GT(link.wire.size(), secret.size());  // all of it went, as ciphertext
}

TEST(TlsChannelTest, TamperedRecordIsRefused) {
  TlsLink link(KeysWithPsk(4), KeysWithPsk(4));
  ASSERT_OK(link.Handshake());
  link.client_to_server = [](std::vector<uint8_t>* bytes) {
    if (bytes->size() > 40) (*bytes)[40] ^= 0x01;  // inside the first record's ciphertext
  };
  const auto payload = Pattern(1000, "kv block ");
  link.Send(payload);
  auto got = link.Receive(payload.size());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied) << got.status().ToString();
  EXPECT_NE(got.status().message().find("failed its check"), std::string::npos)
      << got.status().ToString();
  // Sticky: the stream is dead, not resynchronised.
  EXPECT_FALSE(link.server->Peek().ok());
}

TEST(TlsChannelTest, ReplayedRecordIsRefused) {
  TlsLink link(KeysWithPsk(5), KeysWithPsk(5));
  ASSERT_OK(link.Handshake());
  std::vector<uint8_t> first_record;
  link.client_to_server = [&](std::vector<uint8_t>* bytes) {
    if (first_record.empty()) {
      first_record = *bytes;
    } else {
      *bytes = first_record;  // the next record replaced by the first again
    }
  };
  const auto one = Pattern(64, "step 1 ");
  link.Send(one);
  auto got = link.Receive(one.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, one);
  link.Send(Pattern(64, "step 2 "));
  got = link.Receive(64);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied) << got.status().ToString();
}

TEST(TlsChannelTest, PeerGoneInsideARecordIsUnavailableNotTampering) {
  // A dead peer is the transport's usual dead-peer error, not a TLS alarm.
  TlsLink link(KeysWithPsk(10), KeysWithPsk(10));
  ASSERT_OK(link.Handshake());
  link.client_to_server = [](std::vector<uint8_t>* bytes) { bytes->resize(bytes->size() / 2); };
  link.Send(Pattern(4000, "half a record "));
  link.relay_b.Reset();
  auto got = link.Receive(4000);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
}

TEST(TlsChannelTest, AnotherKeyFailsTheHandshake) {
  TlsLink link(KeysWithPsk(6), KeysWithPsk(7));
  Status s = link.Handshake();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("TLS handshake"), std::string::npos) << s.ToString();
}

TEST(TlsChannelTest, PeerWithoutTlsFailsTheHandshake) {
  // A client speaking per-frame-authenticated records instead of TLS.
  auto [c, s] = testing::SocketPair();
  AuthenticatedChannel plain(testing::TcpOver(std::move(c)), KeysWithPsk(8));
  auto server = Tls(std::move(s), KeysWithPsk(8), TlsChannel::Role::kServer);
  const auto frame = Pattern(64, "hello ");
  ASSERT_TRUE(plain.Write(frame.data(), frame.size()).ok());
  TlsChannel* one[] = {server.get()};
  Status status = CompleteTlsHandshakes(one, Deadline::AfterMs(5000));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status.ToString();
  EXPECT_NE(status.message().find("TESSERA_TCP_TLS"), std::string::npos) << status.ToString();
}

TEST(TlsChannelTest, SilentPeerIsADeadlineNotAHang) {
  auto [c, s] = testing::SocketPair();
  auto server = Tls(std::move(s), KeysWithPsk(9), TlsChannel::Role::kServer);
  TlsChannel* one[] = {server.get()};
  Status status = CompleteTlsHandshakes(one, Deadline::AfterMs(200));
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  EXPECT_NE(status.message().find("peer:1"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace tessera::comm
