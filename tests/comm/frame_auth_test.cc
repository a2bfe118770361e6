// Per-frame authentication of the TCP transport (AuthenticatedChannel): session keys
// from the handshake, a byte-exact round trip under partial writes, and tampered,
// replayed, reordered, truncated, foreign-key and unauthenticated frames, each a
// clear error naming the peer (never data, a crash or a hang).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "base/check.h"
#include "comm/communicator.h"
#include "comm/messenger.h"
#include "comm/net_util.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/hash_store.h"
#include "comm/transport/authenticated_channel.h"
#include "comm/transport/tcp_channel.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

constexpr uint32_t kFrameMagic = 0x314d5354;  // the messenger's "TSM1"

SessionKeys Keys(uint8_t seed) {
  SessionKeys k;
  for (size_t i = 0; i < 32; ++i) {
    k.send[i] = static_cast<uint8_t>(seed + i);
    k.recv[i] = static_cast<uint8_t>(seed * 3 + i);
  }
  return k;
}

SessionKeys Mirror(const SessionKeys& k) { return SessionKeys{.send = k.recv, .recv = k.send}; }

// What an AuthenticatedChannel with `keys` puts on the wire for these writes.
std::vector<uint8_t> Seal(const SessionKeys& keys,
                          const std::vector<std::vector<uint8_t>>& writes) {
  auto [a, b] = testing::SocketPair();
  const int raw = b.get();
  AuthenticatedChannel writer(testing::TcpOver(std::move(a)), keys);
  std::vector<uint8_t> wire;
  auto drain = [&] {
    uint8_t buf[65536];
    ssize_t n;
    while ((n = ::read(raw, buf, sizeof(buf))) > 0) wire.insert(wire.end(), buf, buf + n);
  };
  for (const auto& w : writes) {
    size_t done = 0;
    while (done < w.size()) {
      auto n = writer.Write(w.data() + done, w.size() - done);
      TESSERA_CHECK(n.ok());
      done += *n;
      drain();
    }
  }
  drain();
  return wire;
}

// A messenger frame: header, payload, padding.
std::vector<uint8_t> MessengerFrame(int32_t tag, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> f(16 + payload.size() + (8 - payload.size() % 8) % 8, 0);
  const uint64_t size = payload.size();
  std::memcpy(f.data(), &kFrameMagic, 4);
  std::memcpy(f.data() + 4, &tag, 4);
  std::memcpy(f.data() + 8, &size, 8);
  std::memcpy(f.data() + 16, payload.data(), payload.size());
  return f;
}

std::vector<uint8_t> Payload(size_t n, uint8_t seed) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 13);
  return p;
}

// Rank 0's messenger whose peer (rank 1) speaks through an AuthenticatedChannel
// with `keys` (rank 0's view); the test writes rank 1's raw wire bytes into `evil`.
struct AuthenticatedPeer {
  UniqueFd evil;
  std::unique_ptr<Messenger> messenger;
  explicit AuthenticatedPeer(const SessionKeys& keys) {
    auto [mine, theirs] = testing::SocketPair();
    evil = std::move(theirs);
    std::vector<std::unique_ptr<Channel>> channels(2);
    channels[1] = std::make_unique<AuthenticatedChannel>(testing::TcpOver(std::move(mine)), keys);
    std::vector<PeerInfo> peers(2);
    peers[1].address = "evil:1";
    WaitOptions wait;
    wait.timeout_ms = 5000;
    wait.unexpected_limit_bytes = 1 << 20;
    messenger = std::make_unique<Messenger>(0, 2, std::move(channels), std::move(peers), nullptr,
                                            wait, nullptr);
  }
  void Send(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(::write(evil.get(), bytes.data(), bytes.size()), (ssize_t)bytes.size());
  }
  Status Receive(int32_t tag, std::vector<uint8_t>* buf) {
    EXPECT_TRUE(messenger->Begin(Primitive::kRecv).ok());
    RecvOp op(1, tag, buf->data(), buf->size());
    messenger->PostRecv(&op);
    return messenger->WaitAll({&op});
  }
};

TEST(SessionKeysTest, BothEndsOfAHandshakeDeriveMirroredFreshKeys) {
  auto handshake = [](std::string_view client_token, std::string_view server_token,
                      SessionKeys* client, SessionKeys* server) {
    int fds[2];
    TESSERA_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    UniqueFd c(fds[0]), s(fds[1]);
    Status server_status;
    std::thread t([&] {
      server_status = AuthenticateAsServer(s.get(), server_token, Deadline::AfterMs(5000), server);
    });
    Status client_status =
        AuthenticateAsClient(c.get(), client_token, Deadline::AfterMs(5000), client);
    t.join();
    return client_status.ok() && server_status.ok();
  };
  SessionKeys c1, s1, c2, s2;
  ASSERT_TRUE(handshake("tok", "tok", &c1, &s1));
  EXPECT_EQ(c1.send, s1.recv);
  EXPECT_EQ(c1.recv, s1.send);
  EXPECT_NE(c1.send, c1.recv);  // one key per direction
  ASSERT_TRUE(handshake("tok", "tok", &c2, &s2));
  EXPECT_NE(c1.send, c2.send);  // fresh nonces, fresh keys
  // The token is an input: same nonces, another token, other keys.
  uint8_t n1[32] = {1}, n2[32] = {2};
  EXPECT_NE(DeriveClientSessionKeys("a", n1, n2).send, DeriveClientSessionKeys("b", n1, n2).send);
  EXPECT_EQ(DeriveClientSessionKeys("a", n1, n2).send, DeriveClientSessionKeys("a", n1, n2).send);
}

TEST(FrameAuthTest, StreamRoundTripsByteExactThroughPartialWrites) {
  // Socket buffers fill, so writes are taken in pieces; sizes are odd so records
  // end off 8-byte boundaries; the reader sees aligned, whole 8-byte elements.
  const SessionKeys keys = Keys(7);
  auto [a, b] = testing::SocketPair();
  AuthenticatedChannel writer(testing::TcpOver(std::move(a)), keys);
  AuthenticatedChannel reader(testing::TcpOver(std::move(b)), Mirror(keys));
  std::mt19937 rng(1);
  std::vector<uint8_t> sent(3 << 20);
  for (auto& x : sent) x = static_cast<uint8_t>(rng());
  std::vector<uint8_t> got(sent.size());
  size_t written = 0, read = 0;
  while (read < sent.size()) {
    if (written < sent.size()) {
      size_t want = std::min<size_t>(sent.size() - written, 1 + rng() % 200'000);
      auto n = writer.Write(sent.data() + written, want);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      written += *n;
    }
    if (rng() % 2 == 0) {
      auto span = reader.Peek();
      ASSERT_TRUE(span.ok()) << span.status().ToString();
      if (span->empty()) continue;
      // The address keeps the stream offset's alignment mod 8.
      ASSERT_EQ(reinterpret_cast<uintptr_t>(span->data()) % 8, read % 8);
      if (sent.size() - read - span->size() >= 8 && span->size() < 8) {
        ASSERT_EQ((read + span->size()) % 8, 0u) << "a partial element at " << read;
      }
      size_t n = std::min<size_t>(span->size(), 1 + rng() % 70'000);
      std::memcpy(got.data() + read, span->data(), n);
      reader.Consume(n);
      read += n;
    } else {
      auto n =
          reader.ReadInto(got.data() + read, std::min<size_t>(sent.size() - read, 100'000), false);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      read += *n;
    }
  }
  EXPECT_EQ(got, sent);
}

TEST(FrameAuthTest, AuthenticatedFramesReachTheMessenger) {
  const SessionKeys keys = Keys(1);
  AuthenticatedPeer peer(keys);
  auto payload = Payload(100, 3);
  peer.Send(Seal(Mirror(keys), {MessengerFrame(5, payload)}));
  std::vector<uint8_t> buf(100);
  ASSERT_OK(peer.Receive(5, &buf));
  EXPECT_EQ(buf, payload);
}

TEST(FrameAuthTest, TamperedFrameIsRefused) {
  const SessionKeys keys = Keys(1);
  for (size_t at : {size_t{3}, size_t{9}, size_t{20}, size_t{32 + 16 + 50}}) {  // magic..payload
    AuthenticatedPeer peer(keys);
    auto wire = Seal(Mirror(keys), {MessengerFrame(5, Payload(100, 3))});
    wire[at] ^= 0x20;
    peer.Send(wire);
    std::vector<uint8_t> buf(100);
    Status s = peer.Receive(5, &buf);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << at << ": " << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
    if (at >= 16) {
      EXPECT_NE(s.message().find("wrong MAC"), std::string::npos) << s.ToString();
    }
    // The tampered payload never reached the receive buffer.
    EXPECT_NE(buf[50], Payload(100, 3)[50] ^ 0x20);
  }
}

TEST(FrameAuthTest, ReplayedFrameIsRefused) {
  const SessionKeys keys = Keys(2);
  AuthenticatedPeer peer(keys);
  auto wire = Seal(Mirror(keys), {MessengerFrame(5, Payload(40, 1))});
  peer.Send(wire);
  std::vector<uint8_t> buf(40);
  ASSERT_OK(peer.Receive(5, &buf));
  peer.Send(wire);  // the very same bytes again
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("frame number 0 where 1 was due"), std::string::npos) << s.ToString();
}

TEST(FrameAuthTest, ReorderedFramesAreRefused) {
  const SessionKeys keys = Keys(3);
  AuthenticatedPeer peer(keys);
  auto first = Seal(Mirror(keys), {MessengerFrame(5, Payload(8, 1))});
  auto both = Seal(Mirror(keys), {MessengerFrame(5, Payload(8, 1)), MessengerFrame(6, {})});
  // Send record 1 before record 0.
  peer.Send(std::vector<uint8_t>(both.begin() + first.size(), both.end()));
  peer.Send(first);
  std::vector<uint8_t> buf(8);
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("replayed, reordered"), std::string::npos) << s.ToString();
}

TEST(FrameAuthTest, TruncatedFrameIsUnavailable) {
  const SessionKeys keys = Keys(4);
  for (size_t keep : {size_t{20}, size_t{60}}) {  // inside the header, inside the payload
    AuthenticatedPeer peer(keys);
    auto wire = Seal(Mirror(keys), {MessengerFrame(5, Payload(100, 3))});
    wire.resize(keep);
    peer.Send(wire);
    peer.evil.Reset();
    std::vector<uint8_t> buf(100);
    Status s = peer.Receive(5, &buf);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  }
}

TEST(FrameAuthTest, FrameUnderAnotherKeyIsRefused) {
  AuthenticatedPeer peer(Keys(5));
  peer.Send(Seal(Mirror(Keys(6)), {MessengerFrame(5, Payload(16, 1))}));
  std::vector<uint8_t> buf(16);
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("another session key"), std::string::npos) << s.ToString();
}

TEST(FrameAuthTest, OwnFramesReflectedBackAreRefused) {
  // The receive key is not the send key: our own records sent back do not pass.
  const SessionKeys keys = Keys(8);
  AuthenticatedPeer peer(keys);
  peer.Send(Seal(keys, {MessengerFrame(5, Payload(16, 1))}));
  std::vector<uint8_t> buf(16);
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
}

TEST(FrameAuthTest, UnauthenticatedFrameIsRefused) {
  AuthenticatedPeer peer(Keys(9));
  peer.Send(MessengerFrame(5, Payload(64, 1)));
  std::vector<uint8_t> buf(64);
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("TESSERA_TCP_FRAME_AUTH"), std::string::npos) << s.ToString();
}

TEST(FrameAuthTest, ImpossibleRecordLengthIsRefusedWithoutWaiting) {
  AuthenticatedPeer peer(Keys(10));
  std::vector<uint8_t> header(32, 0);
  const uint32_t magic = frame_auth::kRecordMagic, length = 1u << 30;
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 4, &length, 4);
  peer.Send(header);
  std::vector<uint8_t> buf(16);
  Status s = peer.Receive(5, &buf);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("impossible length"), std::string::npos) << s.ToString();
}

// Two ranks over TCP (threads) all-reduce a large vector (many records, striped
// connections) with frames authenticated, not authenticated, or over TLS: the same
// bits every way, and the same as the sum computed here.
enum class Wire { kPlain, kAuthenticated, kTls };

std::vector<float> TcpAllReduce(Wire wire) {
  auto store = std::make_shared<HashStore>();
  CommOptions options = testing::TestOptions(TransportKind::kTcp);
  options.job_id = testing::UniqueJobId("frameauth");
  options.cluster_token = "secret";
  options.tcp_frame_auth = wire == Wire::kAuthenticated;
  options.tcp_tls = wire == Wire::kTls;
  std::vector<std::vector<float>> data(2, std::vector<float>(300'001));
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = 0.25f * (i % 97) + r * 1.5f;
  }
  auto rank = [&](int r) {
    auto comm = Communicator::Create(store, r, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    const std::string transport = (*comm)->TransportTo(1 - r);
    EXPECT_EQ(transport.find("authenticated") != std::string::npos, wire == Wire::kAuthenticated)
        << transport;
    EXPECT_EQ(transport.find("TLS 1.3") != std::string::npos, wire == Wire::kTls) << transport;
    ASSERT_OK((*comm)->AllReduce(data[r].data(), data[r].data(), data[r].size(), DataType::kF32,
                                 ReduceOp::kSum));
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  EXPECT_EQ(data[0], data[1]);
  return data[0];
}

TEST(FrameAuthTest, TcpCollectivesGiveTheSameBitsWithAndWithoutFrameAuthAndOverTls) {
  std::vector<float> with = TcpAllReduce(Wire::kAuthenticated);
  std::vector<float> without = TcpAllReduce(Wire::kPlain);
  std::vector<float> tls = TcpAllReduce(Wire::kTls);
  ASSERT_EQ(with.size(), 300'001u);
  EXPECT_EQ(std::memcmp(with.data(), without.data(), with.size() * sizeof(float)), 0);
  ASSERT_EQ(tls.size(), 300'001u);
  EXPECT_EQ(std::memcmp(with.data(), tls.data(), with.size() * sizeof(float)), 0);
  EXPECT_EQ(with[5], 0.25f * 5 + 0.25f * 5 + 1.5f);
}

TEST(FrameAuthTest, RanksThatDisagreeOnTlsFailClearly) {
  // Rank 1 (which connects) speaks TLS, rank 0 does not: rank 0 refuses the
  // connection with an error naming the knob; rank 1 fails too (its peer is gone:
  // at once, or at its deadline when rank 0 had closed before it connected).
  auto store = std::make_shared<HashStore>();
  const std::string job = testing::UniqueJobId("tlsmismatch");
  Status status[2];
  auto rank = [&](int r) {
    CommOptions options = testing::TestOptions(TransportKind::kTcp);
    options.job_id = job;
    options.cluster_token = "secret";
    options.timeout_ms = 3'000;
    options.tcp_tls = r == 1;
    status[r] = Communicator::Create(store, r, 2, options).status();
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  EXPECT_FALSE(status[0].ok());
  EXPECT_NE(status[0].message().find("TESSERA_TCP_TLS"), std::string::npos) << status[0].ToString();
  EXPECT_NE(status[0].message().find("rank 1 has TLS on"), std::string::npos)
      << status[0].ToString();
  EXPECT_FALSE(status[1].ok());
}

}  // namespace
}  // namespace tessera::comm
