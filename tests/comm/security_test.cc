// Cluster-token authentication (store and transport), malformed and oversized
// frames from a peer, corrupt shared-memory chunks: each is a clear error, never
// a crash, hang or huge allocation.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/exposure.h"
#include "comm/launcher.h"
#include "comm/messenger.h"
#include "comm/net_util.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/file_store.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/transport/shm_channel.h"
#include "comm/transport/tcp_channel.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

TEST(StoreTest, TcpStoreSetGetAddWaitWithToken) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "secret");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  HostPort address{"127.0.0.1", (*server)->port()};
  auto a = TcpStore::Connect(address, "secret", Deadline::AfterMs(5000));
  auto b = TcpStore::Connect(address, "secret", Deadline::AfterMs(5000));
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_OK((*b)->SetString("k", "v1"));
  });
  auto got = (*a)->GetString("k", Deadline::AfterMs(5000));  // waits for the setter
  setter.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "v1");
  EXPECT_EQ(*(*a)->Add("n", 5), 5);
  EXPECT_EQ(*(*b)->Add("n", -2), 3);
  auto missing = (*a)->GetString("never", Deadline::AfterMs(100));
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(StoreTest, WrongTokenIsRefusedAndCannotInject) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "secret");
  ASSERT_TRUE(server.ok());
  HostPort address{"127.0.0.1", (*server)->port()};
  auto intruder = TcpStore::Connect(address, "guess", Deadline::AfterMs(5000));
  ASSERT_FALSE(intruder.ok());
  EXPECT_EQ(intruder.status().code(), StatusCode::kPermissionDenied)
      << intruder.status().ToString();
  // A raw client that skips the handshake and sends a SET request is dropped.
  auto raw = ConnectTcp(address, Deadline::AfterMs(5000));
  ASSERT_TRUE(raw.ok());
  uint8_t request[64] = {1, 1, 0, 0, 0, 'k', 1, 0, 0, 0, 0, 0, 0, 0, 'x'};
  (void)WriteFull(raw->get(), request, sizeof(request), Deadline::AfterMs(1000));
  // A client that knows the token sees no injected key.
  auto good = TcpStore::Connect(address, "secret", Deadline::AfterMs(5000));
  ASSERT_TRUE(good.ok());
  EXPECT_FALSE((*good)->GetString("k", Deadline::AfterMs(200)).ok());
  // A server without the token cannot fool a client either.
  auto fake = TcpStoreServer::Start("127.0.0.1", 0, "other");
  ASSERT_TRUE(fake.ok());
  auto fooled =
      TcpStore::Connect(HostPort{"127.0.0.1", (*fake)->port()}, "secret", Deadline::AfterMs(5000));
  EXPECT_EQ(fooled.status().code(), StatusCode::kPermissionDenied);
}

TEST(StoreTest, FileStoreSetGetAdd) {
  std::string dir = "/tmp/tessera-test-" + testing::UniqueJobId("fs");
  auto store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok());
  ASSERT_OK((*store)->SetString("a/b", "hello"));
  EXPECT_EQ(*(*store)->GetString("a/b", Deadline::AfterMs(100)), "hello");
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&] {
      for (int i = 0; i < 25; ++i) ASSERT_TRUE((*store)->Add("count", 1).ok());
    });
  }
  for (auto& t : adders) t.join();
  EXPECT_EQ(*(*store)->Add("count", 0), 100);
  EXPECT_EQ((*store)->GetString("none", Deadline::AfterMs(50)).status().code(),
            StatusCode::kDeadlineExceeded);
  std::filesystem::remove_all(dir);
}

TEST(StoreTest, FileStoreDirectoryGoesWithTheLastRank) {
  std::string dir = "/tmp/tessera-test-" + testing::UniqueJobId("fsrm");
  auto a = FileStore::Open(dir);
  auto b = FileStore::Open(dir);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->RemoveWhenAllLeft(2);
  (*b)->RemoveWhenAllLeft(2);
  ASSERT_OK((*a)->SetString("k", "v"));
  a->reset();
  EXPECT_TRUE(std::filesystem::exists(dir)) << "removed while a rank still uses it";
  EXPECT_EQ(*(*b)->GetString("k", Deadline::AfterMs(100)), "v");
  b->reset();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(TransportAuthTest, IntruderWithoutTokenIsRefusedAndJobStillConnects) {
  auto store = std::make_shared<HashStore>();
  CommOptions options = testing::TestOptions(TransportKind::kTcp);
  options.job_id = testing::UniqueJobId("auth");
  options.cluster_token = "cluster-secret";
  std::thread intruder([&] {
    auto addr =
        store->GetString("comm/" + options.job_id + "/world/addr/0", Deadline::AfterMs(10000));
    ASSERT_TRUE(addr.ok());
    auto hp = ParseHostPort(*addr);
    auto fd = ConnectTcp(*hp, Deadline::AfterMs(5000));
    ASSERT_TRUE(fd.ok());
    Status s = AuthenticateAsClient(fd->get(), "not-the-token", Deadline::AfterMs(5000));
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  });
  std::thread rank1([&] {
    // Join late so the intruder reaches rank 0 first.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto comm = Communicator::Create(store, 1, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    int32_t v = 2;
    ASSERT_OK((*comm)->AllReduce(&v, &v, 1, DataType::kI32, ReduceOp::kSum));
    EXPECT_EQ(v, 3);
  });
  auto comm = Communicator::Create(store, 0, 2, options);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  int32_t v = 1;
  ASSERT_OK((*comm)->AllReduce(&v, &v, 1, DataType::kI32, ReduceOp::kSum));
  EXPECT_EQ(v, 3);
  intruder.join();
  rank1.join();
}

TEST(ExposureTest, LoopbackHostsAreRecognised) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.3.2.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost(""));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
  EXPECT_FALSE(IsLoopbackHost("192.0.2.7"));
  EXPECT_FALSE(IsLoopbackHost("no-such-host.invalid"));
  EXPECT_EQ(StoreBindHost("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(StoreBindHost("192.0.2.7"), "0.0.0.0");
}

TEST(ExposureTest, ListeningBeyondLoopbackNeedsATokenOrTheInsecureOptOut) {
  EXPECT_TRUE(CheckListeningNeedsToken("the store", "127.0.0.1", "", false).ok());
  EXPECT_TRUE(CheckListeningNeedsToken("the store", "0.0.0.0", "secret", false).ok());
  EXPECT_TRUE(
      CheckListeningNeedsToken("the store", "0.0.0.0", "", /*insecure_no_token=*/true).ok());
  const Status refused = CheckListeningNeedsToken("the store", "192.0.2.7", "", false);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  const std::string& message = refused.message();
  EXPECT_NE(message.find("the store would listen on 192.0.2.7"), std::string::npos) << message;
  EXPECT_NE(message.find("--insecure-no-token"), std::string::npos) << message;
  // A fresh token to copy: 32 hex digits.
  const size_t at = message.find("TESSERA_CLUSTER_TOKEN=");
  ASSERT_NE(at, std::string::npos) << message;
  const std::string token = message.substr(at + 22, 32);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
  EXPECT_EQ(message[at + 22 + 32], ' ');
  EXPECT_NE(*GenerateClusterToken(), *GenerateClusterToken());
}

TEST(ExposureTest, ATcpTransportBeyondLoopbackWithoutATokenIsRefusedBeforeListening) {
  auto store = std::make_shared<HashStore>();
  CommOptions options = testing::TestOptions(TransportKind::kTcp);
  options.job_id = testing::UniqueJobId("exposed");
  options.listen_host = "0.0.0.0";
  std::vector<Status> status(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { status[r] = Communicator::Create(store, r, 2, options).status(); });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kPermissionDenied) << status[r].ToString();
    EXPECT_NE(status[r].message().find("rank " + std::to_string(r) + "'s TCP transport"),
              std::string::npos)
        << status[r].ToString();
    EXPECT_FALSE(store
                     ->GetString("comm/" + options.job_id + "/world/addr/" + std::to_string(r),
                                 Deadline::AfterMs(0))
                     .ok());  // nothing published
  }
}

TEST(ExposureTest, AMultiNodeLaunchWithoutATokenStartsNoRank) {
  const std::string marker = "/tmp/tessera-test-" + testing::UniqueJobId("exposed-launch");
  LaunchSpec spec;
  spec.nnodes = 2;
  spec.node_rank = 1;
  spec.rdzv = {"192.0.2.7", 29999};  // TEST-NET-1: never reached
  spec.argv = {"/bin/sh", "-c", "touch " + marker};
  auto code = LaunchLocalRanks(spec);
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(code.status().code(), StatusCode::kPermissionDenied) << code.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(marker));
}

// A messenger for rank 0 of 2 whose peer (`peer1`) is a raw socket; *evil_fd gets the
// end the test writes rank 1's stream into.
std::unique_ptr<Messenger> MessengerWithRawPeer(PeerInfo peer1, int* evil_fd) {
  int fds[2];
  TESSERA_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  SetNonBlocking(fds[0]);
  *evil_fd = fds[1];
  std::vector<UniqueFd> conn;
  conn.emplace_back(fds[0]);
  std::vector<std::unique_ptr<Channel>> channels(2);
  channels[1] = std::make_unique<TcpChannel>(std::move(conn), 1 << 20, "evil:1");
  std::vector<PeerInfo> peers(2);
  peers[1] = std::move(peer1);
  WaitOptions wait;
  wait.timeout_ms = 5000;
  wait.unexpected_limit_bytes = 1 << 20;
  return std::make_unique<Messenger>(0, 2, std::move(channels), std::move(peers), nullptr, wait,
                                     nullptr);
}

struct EvilPeer {
  int evil_fd = -1;
  std::unique_ptr<Messenger> messenger;
  EvilPeer() {
    PeerInfo peer;
    peer.address = "evil:1";
    messenger = MessengerWithRawPeer(std::move(peer), &evil_fd);
  }
  ~EvilPeer() {
    if (evil_fd >= 0) ::close(evil_fd);
  }
  void Send(const void* data, size_t size) {
    ASSERT_EQ(::write(evil_fd, data, size), (ssize_t)size);
  }
  void Header(uint32_t magic, int32_t tag, uint64_t size) {
    uint8_t h[16];
    std::memcpy(h, &magic, 4);
    std::memcpy(h + 4, &tag, 4);
    std::memcpy(h + 8, &size, 8);
    Send(h, 16);
  }
  Status Receive(int32_t tag, size_t capacity, std::vector<uint8_t>* buf) {
    buf->resize(capacity);
    EXPECT_TRUE(messenger->Begin(Primitive::kRecv).ok());
    RecvOp op(1, tag, buf->data(), capacity);
    messenger->PostRecv(&op);
    return messenger->WaitAll({&op});
  }
};

constexpr uint32_t kMagic = 0x314d5354;

TEST(FrameValidationTest, BadMagicIsAnError) {
  EvilPeer peer;
  peer.Header(0xdeadbeef, 1, 8);
  std::vector<uint8_t> buf;
  Status s = peer.Receive(1, 16, &buf);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("malformed"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
}

TEST(FrameValidationTest, OversizedFrameForPostedReceiveIsAnError) {
  EvilPeer peer;
  peer.Header(kMagic, 1, uint64_t{1} << 60);  // would be an exabyte
  std::vector<uint8_t> buf;
  Status s = peer.Receive(1, 16, &buf);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("16-byte receive"), std::string::npos) << s.ToString();
}

TEST(FrameValidationTest, HugeUnexpectedFrameIsRefusedWithoutAllocating) {
  EvilPeer peer;
  peer.Header(kMagic, 7, uint64_t{1} << 60);  // no receive for tag 7 is posted
  std::vector<uint8_t> buf;
  Status s = peer.Receive(1, 16, &buf);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

TEST(FrameValidationTest, ClosedPeerIsUnavailable) {
  EvilPeer peer;
  peer.Header(kMagic, 1, 64);
  uint8_t partial[10] = {0};
  peer.Send(partial, sizeof(partial));
  ::close(peer.evil_fd);
  peer.evil_fd = -1;
  std::vector<uint8_t> buf;
  Status s = peer.Receive(1, 64, &buf);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("closed"), std::string::npos) << s.ToString();
}

TEST(FrameValidationTest, BufferedMessagesAreDeliveredInTheOrderReceivesArePosted) {
  // Tags 1, 2, 3 arrive; 3 is received first (1 and 2 wait in the buffer), then 2:
  // it must not wait for tag 1's receive (found by comm_frame_fuzz).
  EvilPeer peer;
  for (int32_t tag : {1, 2, 3}) {
    peer.Header(kMagic, tag, 8);
    uint64_t payload = 100 + tag;
    peer.Send(&payload, 8);
  }
  for (int32_t tag : {3, 2, 1}) {
    std::vector<uint8_t> buf;
    Status s = peer.Receive(tag, 8, &buf);
    ASSERT_TRUE(s.ok()) << "tag " << tag << ": " << s.ToString();
    uint64_t got = 0;
    std::memcpy(&got, buf.data(), 8);
    EXPECT_EQ(got, 100u + tag);
  }
}

// Rank 0's messenger with a same-host peer (rank 1) that shared buffer 5 (4 KiB, mapped
// here as `window`); the test writes rank 1's stream, descriptors included.
struct SharedBufferPeer {
  int evil_fd = -1;
  ShmControl control{};
  std::atomic<uint64_t> acks_from{0}, acks_to{0};
  std::vector<uint8_t> window = std::vector<uint8_t>(4096);
  std::unique_ptr<Messenger> messenger;
  SharedBufferPeer() {
    PeerInfo peer;
    peer.address = "shm";
    peer.shm_control = &control;
    peer.copy_acks_from = &acks_from;
    peer.copy_acks_to = &acks_to;
    messenger = MessengerWithRawPeer(std::move(peer), &evil_fd);
    for (size_t i = 0; i < window.size(); ++i) window[i] = static_cast<uint8_t>(i * 7);
    messenger->AddPeerWindow(1, 5, window.data(), window.size());
  }
  ~SharedBufferPeer() { ::close(evil_fd); }
  void Descriptor(int32_t tag, uint64_t size, uint64_t id, uint64_t offset) {
    const uint32_t magic = 0x31575354;  // "TSW1"
    uint8_t h[32];
    std::memcpy(h, &magic, 4);
    std::memcpy(h + 4, &tag, 4);
    std::memcpy(h + 8, &size, 8);
    std::memcpy(h + 16, &id, 8);
    std::memcpy(h + 24, &offset, 8);
    ASSERT_EQ(::write(evil_fd, h, 32), 32);
  }
  Status Receive(int32_t tag, std::vector<uint8_t>* buf) {
    EXPECT_TRUE(messenger->Begin(Primitive::kRecv).ok());
    RecvOp op(1, tag, buf->data(), buf->size());
    messenger->PostRecv(&op);
    return messenger->WaitAll({&op});
  }
};

TEST(FrameValidationTest, SharedBufferDescriptorIsReadInPlaceAndAcknowledged) {
  SharedBufferPeer peer;
  peer.Descriptor(1, 100, 5, 1000);
  std::vector<uint8_t> buf(128, 0);
  ASSERT_TRUE(peer.Receive(1, &buf).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), peer.window.data() + 1000, 100));
  EXPECT_EQ(buf[100], 0);
  EXPECT_EQ(peer.acks_to.load(), 1u);  // the sender's buffer is free again
}

TEST(FrameValidationTest, SharedBufferDescriptorForAnUnknownBufferIsAnError) {
  SharedBufferPeer peer;
  peer.Descriptor(1, 16, 6, 0);
  std::vector<uint8_t> buf(16);
  Status s = peer.Receive(1, &buf);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("shared buffer 6, which it has not shared"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
}

TEST(FrameValidationTest, SharedBufferDescriptorPastTheBufferIsAnError) {
  // Past the end, and an offset + size that wraps around 2^64.
  for (auto [size, offset] :
       {std::pair<uint64_t, uint64_t>{100, 4000}, {16, ~uint64_t{0} - 7}, {~uint64_t{0}, 8}}) {
    SharedBufferPeer peer;
    peer.Descriptor(1, size, 5, offset);
    std::vector<uint8_t> buf(128);
    Status s = peer.Receive(1, &buf);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("of its 4096-byte shared buffer 5"), std::string::npos)
        << s.ToString();
    EXPECT_EQ(peer.acks_to.load(), 0u);
  }
}

TEST(FrameValidationTest, CorruptSharedMemoryChunkIsAnError) {
  std::string job = testing::UniqueJobId("corrupt");
  auto a = ShmSegment::Create("/tessera-" + job + "-a", 2, 64 << 10, 64);
  auto b = ShmSegment::Create("/tessera-" + job + "-b", 2, 64 << 10, 64);
  ASSERT_TRUE(a.ok() && b.ok());
  ShmChannel reader(*a, 0, *b, 1, 4096);
  // The peer (rank 1) writes a chunk header into our ring with an impossible length.
  uint8_t* ring = a->ring_data(1);
  uint32_t len = 0x7ffffff0;
  std::memcpy(ring + 8, &len, 4);
  uint64_t stamp = 0x9e3779b97f4a7c15ull ^ a->control()->ring_salt;  // position 0
  std::memcpy(ring, &stamp, 8);
  auto span = reader.Peek();
  ASSERT_FALSE(span.ok());
  EXPECT_NE(span.status().message().find("corrupt"), std::string::npos);
}

}  // namespace
}  // namespace tessera::comm
