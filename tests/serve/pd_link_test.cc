// The decode side of a KV transfer (serve::KvImportLinks) against a prefill
// peer played by the test over a real two-rank Communicator (shared memory and
// TCP): a transfer lands in exactly the blocks asked for, byte for byte, in one
// burst or streamed in two; a refused transfer, a reply announcing other blocks, a
// truncated block and a prefill that fails mid-stream fail that transfer only (the
// link carries the next one); a burst out of order, an oversized block (the
// communicator refuses it) and a peer that never answers (deadline) fail the
// transfer and reset the link, and nothing is left posted into the cache.
#include "serve/pd_link.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "comm/rendezvous/hash_store.h"
#include "kv/transfer_frame.h"

namespace tessera::serve {
namespace {

using kv::TransferHeader;
using kv::TransferType;
using Frame = std::array<uint8_t, kv::kTransferHeaderBytes>;

kv::KvCacheShape Shape() {
  return {.num_layers = 2,
          .num_kv_heads = 2,
          .head_dim = 8,
          .block_size = 16,
          .type = kernels::KvType::kF16};
}

std::string UniqueJob() {
  static int counter = 0;
  return "pdlink" + std::to_string(::getpid()) + "x" + std::to_string(counter++);
}

// The transfers' reports, by id.
struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, std::pair<Status, int64_t>> done;

  void Add(int64_t id, Status status, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    done[id] = {std::move(status), bytes};
    cv.notify_all();
  }
  std::pair<Status, int64_t> Wait(int64_t id) {
    std::unique_lock<std::mutex> lock(mu);
    const bool arrived =
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return done.count(id) > 0; });
    if (!arrived) return {DeadlineExceededError("no report"), 0};
    return done[id];
  }
};

uint8_t Pattern(int64_t id, size_t block, size_t i) {
  return static_cast<uint8_t>(id * 31 + block * 7 + i);
}

enum class Peer {
  kGood,           // one burst, flagged last
  kTwoBursts,      // the first block, then the rest with the last flag
  kRefuse,         // the reply refuses
  kWrongBlocks,    // the reply announces other blocks
  kTruncated,      // the last block one byte short
  kFailedPrefill,  // a first burst, then a failed last one: empty messages
  kOutOfOrder,     // a burst that skips a block
  kOversized,      // the last block longer than the receive
  kSilent,         // never answers
  // `between` (the test cancels the request) after the request arrived; the
  // answer to the reply must be kAbort
  kCancelBeforeReply,
  // a first burst, `between`, then a kAbort on kPdCancelTag is due; the last
  // burst fails (the prefill was cancelled)
  kCancelMidStream
};

void SendBurst(comm::Communicator& comm, const TransferHeader& h, uint32_t first, uint32_t count,
               bool last, uint32_t status = 0) {
  TransferHeader burst = h;
  burst.type = TransferType::kBurst;
  burst.first_block = first;
  burst.num_blocks = count;
  burst.status = status;
  burst.flags = last ? kv::kLastBurst : 0;
  const Frame frame = kv::EncodeTransferHeader(burst);
  ASSERT_TRUE(comm.Send(frame.data(), frame.size(), 1, PdControlTag(h.transfer_id)).ok());
}

// The prefill side of one transfer, behaving as `how`.
void ServeOne(comm::Communicator& comm, Peer how, const std::function<void()>& between = {}) {
  Frame frame{};
  ASSERT_TRUE(comm.Recv(frame.data(), frame.size(), 1, kPdRequestTag).ok());
  Result<TransferHeader> h = kv::DecodeTransferHeader(frame);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  std::vector<int32_t> tokens(h->num_tokens);
  ASSERT_TRUE(comm.Recv(tokens.data(), tokens.size() * 4, 1, kPdRequestTag).ok());
  EXPECT_EQ(tokens[0], 100);
  if (how == Peer::kSilent) return;
  if (how == Peer::kCancelBeforeReply) between();
  TransferHeader reply = *h;
  reply.type = TransferType::kReply;
  if (how == Peer::kRefuse) reply.status = static_cast<uint32_t>(StatusCode::kUnavailable);
  if (how == Peer::kWrongBlocks) reply.num_blocks += 1;
  const int tag = PdTransferTag(h->transfer_id);
  frame = kv::EncodeTransferHeader(reply);
  ASSERT_TRUE(comm.Send(frame.data(), frame.size(), 1, tag).ok());
  if (how == Peer::kRefuse) return;
  ASSERT_TRUE(comm.Recv(frame.data(), frame.size(), 1, tag).ok());
  Result<TransferHeader> answer = kv::DecodeTransferHeader(frame);
  ASSERT_TRUE(answer.ok());
  if (how == Peer::kWrongBlocks || how == Peer::kCancelBeforeReply) {
    EXPECT_EQ(answer->type, TransferType::kAbort);
    return;
  }
  ASSERT_EQ(answer->type, TransferType::kReady);
  const uint32_t n = h->num_blocks;
  auto send_blocks = [&](size_t from, size_t to, bool empty) {
    for (size_t b = from; b < to; ++b) {
      size_t bytes = empty ? 0 : h->bytes_per_block;
      const bool last = b + 1 == n;
      if (last && how == Peer::kTruncated) bytes -= 1;
      if (last && how == Peer::kOversized) bytes += 64;
      std::vector<uint8_t> data(bytes);
      for (size_t i = 0; i < bytes; ++i) data[i] = Pattern(int64_t(h->transfer_id), b, i);
      Status sent = comm.Send(data.data(), data.size(), 1, tag);
      if (how != Peer::kOversized) ASSERT_TRUE(sent.ok()) << sent.ToString();
    }
  };
  switch (how) {
    case Peer::kTwoBursts:
    case Peer::kFailedPrefill:
      ASSERT_GE(n, 2u);
      SendBurst(comm, *h, 0, 1, false);
      send_blocks(0, 1, false);
      SendBurst(comm, *h, 1, n - 1, true,
                how == Peer::kFailedPrefill ? static_cast<uint32_t>(StatusCode::kAborted) : 0);
      send_blocks(1, n, how == Peer::kFailedPrefill);
      return;
    case Peer::kCancelMidStream: {
      ASSERT_GE(n, 2u);
      SendBurst(comm, *h, 0, 1, false);
      send_blocks(0, 1, false);
      between();
      Frame cancel{};
      ASSERT_TRUE(comm.Recv(cancel.data(), cancel.size(), 1, kPdCancelTag).ok());
      Result<TransferHeader> abort = kv::DecodeTransferHeader(cancel);
      ASSERT_TRUE(abort.ok()) << abort.status().ToString();
      EXPECT_EQ(abort->type, TransferType::kAbort);
      EXPECT_EQ(abort->transfer_id, h->transfer_id);
      SendBurst(comm, *h, 1, n - 1, true, static_cast<uint32_t>(StatusCode::kUnavailable));
      send_blocks(1, n, true);
      return;
    }
    case Peer::kOutOfOrder:
      SendBurst(comm, *h, 1, n - 1, true);  // block 0 never announced
      return;
    default:
      SendBurst(comm, *h, 0, n, true);
      send_blocks(0, n, false);
  }
}

// Joins generation `gen` of link (0, 0) as the prefill side.
std::unique_ptr<comm::Communicator> Join(std::shared_ptr<comm::Store> store,
                                         const comm::CommOptions& options, int64_t gen) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    Result<int64_t> current = store->Add(PdGenerationKey(0, 0), 0);
    if (current.ok() && *current >= gen) {
      auto comm = comm::Communicator::Create(store, 0, 2, options, PdLinkCommId(0, 0, *current));
      if (comm.ok()) return std::move(*comm);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return nullptr;
}

// The decode side's options for a link over `transport` through `store`.
PdLinkOptions TestOptions(std::shared_ptr<comm::Store> store, comm::TransportKind transport) {
  PdLinkOptions options;
  options.store = std::move(store);
  options.comm.job_id = UniqueJob();
  options.comm.transport = transport;
  options.comm.cluster_token = "pd-test-token";
  options.connect_timeout_ms = 20'000;
  return options;
}

class PdLinkTest : public ::testing::TestWithParam<comm::TransportKind> {};

TEST_P(PdLinkTest, BadTransfersFailAloneAndBrokenLinksReset) {
  Result<kv::KvCache> cache = kv::KvCache::Create(Shape(), 16);
  ASSERT_TRUE(cache.ok());
  const size_t block_bytes = static_cast<size_t>(Shape().BytesPerBlock());
  std::memset(cache->block_data(0), 0, block_bytes * 16);
  auto store = std::make_shared<comm::HashStore>();
  PdLinkOptions options = TestOptions(store, GetParam());
  options.transfer_timeout_ms = 1'000;
  Reports reports;
  KvImportLinks links(PdCache{.shape = Shape(), .local = &*cache}, 0, 1, options,
                      [&](int64_t id, Status s, int64_t bytes, int64_t, int64_t) {
                        reports.Add(id, std::move(s), bytes);
                      });
  std::unique_ptr<comm::Communicator> peer = Join(store, options.comm, 1);
  ASSERT_NE(peer, nullptr);

  auto start = [&](int64_t id, std::vector<int32_t> blocks, int64_t first_block = 1) {
    std::vector<int32_t> tokens(static_cast<size_t>(first_block + int64_t(blocks.size())) * 16,
                                100);
    links.Start(id, std::move(tokens), first_block, std::move(blocks));
  };
  auto block_is = [&](int32_t block, int64_t id, size_t index) {
    const uint8_t* data = cache->block_data(block);
    for (size_t i = 0; i < block_bytes; ++i) {
      if (data[i] != Pattern(id, index, i)) return false;
    }
    return true;
  };

  // A good transfer: exactly blocks 3 and 5, byte for byte; bytes reported.
  start(1, {3, 5});
  ServeOne(*peer, Peer::kGood);
  auto [ok1, bytes1] = reports.Wait(1);
  ASSERT_TRUE(ok1.ok()) << ok1.ToString();
  EXPECT_EQ(bytes1, static_cast<int64_t>(2 * block_bytes));
  EXPECT_TRUE(block_is(3, 1, 0));
  EXPECT_TRUE(block_is(5, 1, 1));
  EXPECT_EQ(cache->block_data(4)[0], 0);  // untouched

  // Refused, other blocks announced, a truncated block: that transfer fails only.
  start(2, {6});
  ServeOne(*peer, Peer::kRefuse);
  EXPECT_EQ(reports.Wait(2).first.code(), StatusCode::kUnavailable);
  start(3, {6, 7});
  ServeOne(*peer, Peer::kWrongBlocks);
  Status wrong = reports.Wait(3).first;
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("announces 3 blocks"), std::string::npos) << wrong.ToString();
  start(4, {8, 9});
  ServeOne(*peer, Peer::kTruncated);
  Status truncated = reports.Wait(4).first;
  EXPECT_EQ(truncated.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.message().find("bytes where"), std::string::npos) << truncated.ToString();
  start(5, {10});
  ServeOne(*peer, Peer::kGood);
  ASSERT_TRUE(reports.Wait(5).first.ok());
  EXPECT_TRUE(block_is(10, 5, 0));
  // Streamed in two bursts: the same blocks; a prefill that failed after its first
  // burst: the transfer fails, the link goes on.
  start(51, {1, 2, 4});
  ServeOne(*peer, Peer::kTwoBursts);
  ASSERT_TRUE(reports.Wait(51).first.ok());
  EXPECT_TRUE(block_is(1, 51, 0));
  EXPECT_TRUE(block_is(2, 51, 1));
  EXPECT_TRUE(block_is(4, 51, 2));
  start(52, {6, 7});
  ServeOne(*peer, Peer::kFailedPrefill);
  Status failed = reports.Wait(52).first;
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
  EXPECT_NE(failed.message().find("prefill failed"), std::string::npos) << failed.ToString();
  EXPECT_EQ(links.stats().link_resets, 0);
  EXPECT_EQ(links.stats().failures, 4);

  // A burst out of order: the posted receives' framing is lost; the link is reset.
  start(53, {6, 7});
  ServeOne(*peer, Peer::kOutOfOrder);
  Status disorder = reports.Wait(53).first;
  EXPECT_FALSE(disorder.ok());
  EXPECT_NE(disorder.message().find("out of order"), std::string::npos) << disorder.ToString();
  EXPECT_EQ(links.stats().link_resets, 1);

  // An oversized block (on a new link): the communicator refuses it; reset again.
  peer = Join(store, options.comm, 2);
  ASSERT_NE(peer, nullptr);
  start(6, {11, 12});
  ServeOne(*peer, Peer::kOversized);
  EXPECT_FALSE(reports.Wait(6).first.ok());
  EXPECT_EQ(links.stats().link_resets, 2);

  // A new link (generation 3); a peer that never answers: the deadline fails it.
  peer = Join(store, options.comm, 3);
  ASSERT_NE(peer, nullptr);
  start(7, {13});
  ServeOne(*peer, Peer::kSilent);
  const auto t0 = std::chrono::steady_clock::now();
  Status silent = reports.Wait(7).first;
  EXPECT_EQ(silent.code(), StatusCode::kUnavailable) << silent.ToString();
  EXPECT_NE(silent.message().find("timed out"), std::string::npos) << silent.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(links.stats().link_resets, 3);

  // After all that, a fourth link carries a good transfer again.
  peer = Join(store, options.comm, 4);
  ASSERT_NE(peer, nullptr);
  start(8, {14, 15}, 0);
  ServeOne(*peer, Peer::kGood);
  ASSERT_TRUE(reports.Wait(8).first.ok());
  EXPECT_TRUE(block_is(14, 8, 0));
  EXPECT_TRUE(block_is(15, 8, 1));
}

// What a several-rank decode instance's scheduler lands blocks through: records
// the writes (the executor's own gather and scatter are tested in
// tests/engine/parallel_test.cc and end to end in the PD process tests).
class WriteRecorder final : public engine::StepExecutor {
 public:
  int64_t vocab_size() const override { return 1; }
  int32_t num_kv_blocks() const override { return 16; }
  int32_t kv_block_size() const override { return 16; }
  Status Submit(std::span<const engine::StepEntry>, bool) override {
    return InvalidArgumentError("no steps here");
  }
  Result<std::span<const float>> Collect() override {
    return InvalidArgumentError("no steps here");
  }
  Status WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) override {
    ids.assign(blocks.begin(), blocks.end());
    const size_t bytes = blocks.size() * static_cast<size_t>(Shape().BytesPerBlock());
    written.assign(in, in + bytes);
    return fail;
  }
  std::vector<int32_t> ids;
  std::vector<uint8_t> written;
  Status fail;
};

// An instance of several ranks: the blocks wait in memory until the scheduler lands
// them (KvImporter::Land) through its executor, which gets exactly the bytes sent;
// a transfer whose request ended is dropped; a failed write is the import's error.
TEST_P(PdLinkTest, SeveralRankInstanceLandsBlocksThroughItsExecutor) {
  auto store = std::make_shared<comm::HashStore>();
  PdLinkOptions options = TestOptions(store, GetParam());
  Reports reports;
  KvImportLinks links(PdCache{.shape = Shape()}, 0, 1, options,
                      [&](int64_t id, Status s, int64_t bytes, int64_t, int64_t) {
                        reports.Add(id, std::move(s), bytes);
                      });
  std::unique_ptr<comm::Communicator> peer = Join(store, options.comm, 1);
  ASSERT_NE(peer, nullptr);
  const size_t block_bytes = static_cast<size_t>(Shape().BytesPerBlock());
  for (const Peer how : {Peer::kGood, Peer::kTwoBursts}) {
    const int64_t id = how == Peer::kGood ? 1 : 2;
    links.Start(id, std::vector<int32_t>(4 * 16, 100), 1, {9, 3, 5});
    ServeOne(*peer, how);
    ASSERT_TRUE(reports.Wait(id).first.ok());
    WriteRecorder executor;
    ASSERT_TRUE(links.Land(id, &executor).ok());
    EXPECT_EQ(executor.ids, (std::vector<int32_t>{9, 3, 5}));
    ASSERT_EQ(executor.written.size(), 3 * block_bytes);
    for (size_t b = 0; b < 3; ++b) {
      for (size_t i = 0; i < block_bytes; ++i) {
        ASSERT_EQ(executor.written[b * block_bytes + i], Pattern(id, b, i)) << b << " " << i;
      }
    }
    // Landed once: a second call has nothing left.
    WriteRecorder again;
    ASSERT_TRUE(links.Land(id, &again).ok());
    EXPECT_TRUE(again.ids.empty());
  }
  // The request ended meanwhile: dropped, never written.
  links.Start(3, std::vector<int32_t>(2 * 16, 100), 1, {7});
  ServeOne(*peer, Peer::kGood);
  ASSERT_TRUE(reports.Wait(3).first.ok());
  ASSERT_TRUE(links.Land(3, nullptr).ok());
  WriteRecorder late;
  ASSERT_TRUE(links.Land(3, &late).ok());
  EXPECT_TRUE(late.ids.empty());
  // A failed write (a rank died) is the import's failure.
  links.Start(4, std::vector<int32_t>(2 * 16, 100), 1, {8});
  ServeOne(*peer, Peer::kGood);
  ASSERT_TRUE(reports.Wait(4).first.ok());
  WriteRecorder broken;
  broken.fail = UnavailableError("rank 1 is gone");
  EXPECT_EQ(links.Land(4, &broken).code(), StatusCode::kUnavailable);
}

// A request cancelled while its transfer runs (its client went away): awaiting the
// prefill instance's reply, the transfer is answered kAbort; streaming, the prefill
// instance is told on kPdCancelTag and the transfer ends, failed, with its last
// burst. Either way it is reported once and the link goes on.
TEST_P(PdLinkTest, CancelledTransfersAreGivenUp) {
  Result<kv::KvCache> cache = kv::KvCache::Create(Shape(), 16);
  ASSERT_TRUE(cache.ok());
  auto store = std::make_shared<comm::HashStore>();
  PdLinkOptions options = TestOptions(store, GetParam());
  Reports reports;
  KvImportLinks links(PdCache{.shape = Shape(), .local = &*cache}, 0, 1, options,
                      [&](int64_t id, Status s, int64_t bytes, int64_t, int64_t) {
                        reports.Add(id, std::move(s), bytes);
                      });
  std::unique_ptr<comm::Communicator> peer = Join(store, options.comm, 1);
  ASSERT_NE(peer, nullptr);
  auto tokens = [](size_t blocks) { return std::vector<int32_t>((blocks + 1) * 16, 100); };

  links.Start(1, tokens(2), 1, {3, 5});
  ServeOne(*peer, Peer::kCancelBeforeReply, [&] { links.Cancel(1); });
  Status before = reports.Wait(1).first;
  EXPECT_EQ(before.code(), StatusCode::kAborted) << before.ToString();
  EXPECT_NE(before.message().find("cancelled"), std::string::npos) << before.ToString();

  links.Start(2, tokens(3), 1, {6, 7, 8});
  ServeOne(*peer, Peer::kCancelMidStream, [&] { links.Cancel(2); });
  Status mid = reports.Wait(2).first;
  EXPECT_EQ(mid.code(), StatusCode::kUnavailable) << mid.ToString();
  EXPECT_NE(mid.message().find("prefill failed"), std::string::npos) << mid.ToString();

  // Done transfers and unknown ones: nothing to cancel. The link goes on.
  links.Cancel(1);
  links.Cancel(99);
  links.Start(3, tokens(1), 1, {9});
  ServeOne(*peer, Peer::kGood);
  ASSERT_TRUE(reports.Wait(3).first.ok());
  EXPECT_EQ(links.stats().link_resets, 0);
  EXPECT_EQ(links.stats().failures, 2);
}

INSTANTIATE_TEST_SUITE_P(Transports, PdLinkTest,
                         ::testing::Values(comm::TransportKind::kShm, comm::TransportKind::kTcp),
                         [](const auto& info) {
                           return std::string(comm::TransportKindName(info.param));
                         });

}  // namespace
}  // namespace tessera::serve
