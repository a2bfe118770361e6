// The decode side of a KV transfer (serve::KvImportLinks) against a prefill
// peer played by the test over a real two-rank Communicator (shared memory and
// TCP): a transfer lands in exactly the blocks asked for, byte for byte, in one
// burst or streamed layer by layer; a refused transfer, a reply announcing other
// blocks, a truncated piece and a prefill that fails mid-stream fail that
// transfer only (the link carries the next one); a burst out of order, a last
// burst with pieces still due, an oversized piece (the communicator refuses it)
// and a peer that never answers (deadline) fail the transfer and reset the link,
// and nothing is left posted into the cache. The prefill side (KvExportLinks)
// against a decode peer played by the test: requests it cannot serve are refused
// and the link goes on.
#include "serve/pd_link.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/thread_pool.h"
#include "comm/communicator.h"
#include "comm/rendezvous/hash_store.h"
#include "engine/driver.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "kv/transfer_codec.h"
#include "kv/transfer_frame.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/shard.h"
#include "model/tokenizer.h"

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
  std::map<int64_t, int64_t> streamed;  // bytes that came before the prefill's end

  void Add(int64_t id, Status status, int64_t bytes, int64_t streamed_bytes = 0) {
    std::lock_guard<std::mutex> lock(mu);
    done[id] = {std::move(status), bytes};
    streamed[id] = streamed_bytes;
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
  kGood,           // every piece in one burst after the prefill's end, then the last
  kLayerByLayer,   // layer 0 of block 0, layer 1 of it, layer 0 of the rest while the
                   // prefill runs; layer 1 of the rest after its end; then the last
  kRefuse,         // the reply refuses
  kWrongBlocks,    // the reply announces other blocks
  kTruncated,      // the last piece one byte short
  kFailedPrefill,  // a first burst, then a failed one: empty messages
  kOutOfOrder,     // a burst that skips a block
  kLastTooEarly,   // the last burst while layer 1's pieces are still due
  kOversized,      // the last piece longer than the receive
  kSilent,         // never answers
  // `between` (the test cancels the request) after the request arrived; the
  // answer to the reply must be kAbort
  kCancelBeforeReply,
  // a first burst, `between`, then a kAbort on kPdCancelTag is due; the rest
  // fails (the prefill was cancelled)
  kCancelMidStream
};

// The pieces (blocks [first, first + count) of layers [layer_begin, layer_end))
// the scripted prefill side sends; kPrefillEnded from the prefill's end on.
struct Burst {
  uint32_t first, count, layer_begin, layer_end;
  uint32_t flags = 0;
  uint32_t status = 0;
};

void SendFrame(comm::Communicator& comm, const TransferHeader& h, const Burst& b) {
  TransferHeader burst = h;
  burst.type = TransferType::kBurst;
  burst.first_block = b.first;
  burst.num_blocks = b.count;
  burst.layer_begin = b.layer_begin;
  burst.num_layers = b.layer_end - b.layer_begin;
  burst.status = b.status;
  burst.flags = b.flags;
  const Frame frame = kv::EncodeTransferHeader(burst);
  ASSERT_TRUE(comm.Send(frame.data(), frame.size(), 1, PdControlTag(h.transfer_id)).ok());
}

// The prefill side of one transfer, behaving as `how`. A piece's bytes are
// Pattern(id, block, i) for i its offset in the block.
void ServeOne(comm::Communicator& comm, Peer how, const std::function<void()>& between = {}) {
  Frame frame{};
  ASSERT_TRUE(comm.Recv(frame.data(), frame.size(), 1, kPdRequestTag).ok());
  Result<TransferHeader> h = kv::DecodeTransferHeader(frame);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->num_layers, uint32_t(Shape().num_layers));
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
  const uint32_t n = h->num_blocks, layers = h->num_layers;
  const size_t piece = h->bytes_per_block / layers;
  auto send = [&](const Burst& b) {
    SendFrame(comm, *h, b);
    for (size_t block = b.first; block < b.first + b.count; ++block) {
      for (uint32_t l = b.layer_begin; l < b.layer_end; ++l) {
        size_t bytes = b.status != 0 ? 0 : piece;
        const bool last_piece = block + 1 == n && l + 1 == layers;
        if (last_piece && how == Peer::kTruncated) bytes -= 1;
        if (last_piece && how == Peer::kOversized) bytes += 64;
        std::vector<uint8_t> data(bytes);
        for (size_t i = 0; i < bytes; ++i) {
          data[i] = Pattern(int64_t(h->transfer_id), block, l * piece + i);
        }
        Status sent = comm.Send(data.data(), data.size(), 1, PdLayerTag(h->transfer_id, l));
        if (how != Peer::kOversized) ASSERT_TRUE(sent.ok()) << sent.ToString();
      }
    }
  };
  const uint32_t ended = kv::kPrefillEnded, last = kv::kPrefillEnded | kv::kLastBurst;
  const uint32_t failed = static_cast<uint32_t>(StatusCode::kAborted);
  switch (how) {
    case Peer::kLayerByLayer:
      ASSERT_GE(n, 2u);
      ASSERT_EQ(layers, 2u);
      send({0, 1, 0, 1});
      send({0, 1, 1, 2});
      send({1, n - 1, 0, 1});
      send({1, n - 1, 1, 2, ended});
      send({n, 0, 0, 0, last});
      return;
    case Peer::kFailedPrefill:
      ASSERT_GE(n, 2u);
      send({0, 1, 0, layers});
      send({1, n - 1, 0, layers, ended, failed});
      send({n, 0, 0, 0, last, failed});
      return;
    case Peer::kCancelMidStream: {
      ASSERT_GE(n, 2u);
      send({0, 1, 0, layers});
      between();
      Frame cancel{};
      ASSERT_TRUE(comm.Recv(cancel.data(), cancel.size(), 1, kPdCancelTag).ok());
      Result<TransferHeader> abort = kv::DecodeTransferHeader(cancel);
      ASSERT_TRUE(abort.ok()) << abort.status().ToString();
      EXPECT_EQ(abort->type, TransferType::kAbort);
      EXPECT_EQ(abort->transfer_id, h->transfer_id);
      const uint32_t unavailable = static_cast<uint32_t>(StatusCode::kUnavailable);
      send({1, n - 1, 0, layers, ended, unavailable});
      send({n, 0, 0, 0, last, unavailable});
      return;
    }
    case Peer::kOutOfOrder:
      SendFrame(comm, *h, {1, n - 1, 0, layers, ended});  // block 0 never announced
      return;
    case Peer::kLastTooEarly:
      send({0, n, 0, 1, ended});
      send({n, 0, 0, 0, last});
      return;
    default:
      send({0, n, 0, layers, ended});
      send({n, 0, 0, 0, last});
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
                      [&](int64_t id, Status s, int64_t bytes, int64_t, int64_t streamed) {
                        reports.Add(id, std::move(s), bytes, streamed);
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
  EXPECT_EQ(reports.streamed[1], 0);  // all of it after the prefill's end
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
  // Streamed layer by layer in four bursts: the same blocks; the pieces before the
  // prefill's end (block 0's two, layer 0 of the other two) count as streamed. A
  // prefill that failed after its first burst: the transfer fails, the link goes on.
  start(51, {1, 2, 4});
  ServeOne(*peer, Peer::kLayerByLayer);
  ASSERT_TRUE(reports.Wait(51).first.ok());
  EXPECT_EQ(reports.streamed[51], static_cast<int64_t>(4 * block_bytes / 2));
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
  // The last burst while pieces are due: reset as well.
  peer = Join(store, options.comm, 2);
  ASSERT_NE(peer, nullptr);
  start(54, {6, 7});
  ServeOne(*peer, Peer::kLastTooEarly);
  Status early = reports.Wait(54).first;
  EXPECT_NE(early.message().find("out of order"), std::string::npos) << early.ToString();
  EXPECT_EQ(links.stats().link_resets, 2);

  // An oversized piece (on a new link): the communicator refuses it; reset again.
  peer = Join(store, options.comm, 3);
  ASSERT_NE(peer, nullptr);
  start(6, {11, 12});
  ServeOne(*peer, Peer::kOversized);
  EXPECT_FALSE(reports.Wait(6).first.ok());
  EXPECT_EQ(links.stats().link_resets, 3);

  // A new link (generation 4); a peer that never answers: the deadline fails it.
  peer = Join(store, options.comm, 4);
  ASSERT_NE(peer, nullptr);
  start(7, {13});
  ServeOne(*peer, Peer::kSilent);
  const auto t0 = std::chrono::steady_clock::now();
  Status silent = reports.Wait(7).first;
  EXPECT_EQ(silent.code(), StatusCode::kUnavailable) << silent.ToString();
  EXPECT_NE(silent.message().find("timed out"), std::string::npos) << silent.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(links.stats().link_resets, 4);

  // After all that, a fifth link carries a good transfer again.
  peer = Join(store, options.comm, 5);
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
  for (const Peer how : {Peer::kGood, Peer::kLayerByLayer}) {
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

// The prefill side (serve::KvExportLinks over a real scheduler and engine on
// stories260K) against a decode peer played by the test: a request for more
// tokens than the instance holds, one announcing another layer count or another
// block size, are each answered with a refusal and the link goes on; a good request's pieces then
// stream, every layer of every block, and end with an empty last burst flagged after the prefill's
// end.
TEST_P(PdLinkTest, ThePrefillSideRefusesWhatItCannotServeAndGoesOn) {
  const std::string path = std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no shared models";
  constexpr int64_t kMaxModelLen = 128;
  model::GgufFile file = std::move(model::GgufFile::Open(path).value());
  const model::ModelConfig config = model::ModelConfigFromGguf(file).value();
  const parallel::Partition plan = model::PartitionForModel(file, config, {}).value();
  ThreadPool pool(1);
  engine::RuntimeOptions runtime;
  runtime.kv_capacity_tokens = 4 * kMaxModelLen;
  auto runner = std::move(engine::StageRunner::Create(plan, 0, {}, file, pool, runtime).value());
  engine::Driver driver(*runner);
  const model::Tokenizer tokenizer = std::move(model::Tokenizer::FromGguf(file).value());
  engine::SchedulerOptions sched;
  sched.max_num_seqs = 2;
  sched.max_num_batched_tokens = 64;
  sched.max_model_len = kMaxModelLen;
  engine::Scheduler scheduler(driver, tokenizer, sched);
  std::thread loop([&] { EXPECT_TRUE(scheduler.Run().ok()); });

  auto store = std::make_shared<comm::HashStore>();
  PdLinkOptions options = TestOptions(store, GetParam());
  const kv::KvCacheShape shape = runner->cache().shape();
  std::optional<KvExportLinks> exports;
  exports.emplace(PdCache{.shape = shape, .local = &runner->mutable_cache()}, scheduler, 0, 1,
                  options);
  // The decode side opens generation 1 of link (0, 0).
  ASSERT_TRUE(store->Add(PdGenerationKey(0, 0), 1).ok());
  comm::CommOptions peer_options = options.comm;
  peer_options.timeout_ms = 20'000;
  auto peer = comm::Communicator::Create(store, 1, 2, peer_options, PdLinkCommId(0, 0, 1));
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  comm::Communicator& comm = **peer;
  const uint32_t layers = static_cast<uint32_t>(shape.num_layers);
  const uint64_t block_bytes =
      static_cast<uint64_t>(kv::WireBytesPerBlock(shape, kv::WireType::kRaw));
  auto ask = [&](uint64_t id, uint32_t blocks, uint32_t num_layers, uint64_t bytes) {
    const TransferHeader h{.type = TransferType::kRequest,
                           .transfer_id = id,
                           .num_blocks = blocks,
                           .num_tokens = blocks * 16,
                           .block_size = 16,
                           .bytes_per_block = bytes,
                           .kv_type = static_cast<uint32_t>(shape.type),
                           .num_layers = num_layers};
    const Frame frame = kv::EncodeTransferHeader(h);
    std::vector<int32_t> tokens(h.num_tokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1 + i * 7 % 500);
    EXPECT_TRUE(comm.Send(frame.data(), frame.size(), 0, kPdRequestTag).ok());
    EXPECT_TRUE(comm.Send(tokens.data(), tokens.size() * 4, 0, kPdRequestTag).ok());
    Frame reply{};
    EXPECT_TRUE(comm.Recv(reply.data(), reply.size(), 0, PdTransferTag(id)).ok());
    Result<TransferHeader> r = kv::DecodeTransferHeader(reply);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->type, TransferType::kReply);
    return r.ok() ? r->status : ~0u;
  };
  const uint32_t invalid = static_cast<uint32_t>(StatusCode::kInvalidArgument);
  // 160 tokens: beyond the 128 the instance holds.
  EXPECT_EQ(ask(1, 10, layers, block_bytes), invalid);
  // Another model's layer count (the bytes still split evenly), another block size.
  EXPECT_EQ(ask(2, 2, 1, block_bytes), invalid);
  EXPECT_EQ(ask(3, 2, layers, block_bytes * 2), invalid);
  // The link goes on: a good request streams every piece, then the last burst.
  ASSERT_EQ(ask(4, 2, layers, block_bytes), 0u);
  const Frame ready = kv::EncodeTransferHeader({.type = TransferType::kReady, .transfer_id = 4});
  ASSERT_TRUE(comm.Send(ready.data(), ready.size(), 0, PdTransferTag(4)).ok());
  std::vector<std::vector<int>> got(2, std::vector<int>(layers, 0));
  bool ended = false;
  for (;;) {
    Frame frame{};
    ASSERT_TRUE(comm.Recv(frame.data(), frame.size(), 0, PdControlTag(4)).ok());
    Result<TransferHeader> burst = kv::DecodeTransferHeader(frame);
    ASSERT_TRUE(burst.ok()) << burst.status().ToString();
    ASSERT_EQ(burst->type, TransferType::kBurst);
    ASSERT_EQ(burst->status, 0u);
    ended = ended || (burst->flags & kv::kPrefillEnded) != 0;
    if ((burst->flags & kv::kLastBurst) != 0) break;
    for (uint32_t b = burst->first_block; b < burst->first_block + burst->num_blocks; ++b) {
      for (uint32_t l = burst->layer_begin; l < burst->layer_begin + burst->num_layers; ++l) {
        std::vector<uint8_t> piece(block_bytes / layers + 1);
        size_t size = 0;
        ASSERT_TRUE(
            comm.Recv(piece.data(), piece.size(), 0, PdLayerTag(4, int32_t(l)), &size).ok());
        EXPECT_EQ(size, block_bytes / layers);
        ++got[b][l];
      }
    }
  }
  EXPECT_TRUE(ended);
  for (const auto& block : got) EXPECT_EQ(block, std::vector<int>(layers, 1));
  exports.reset();
  scheduler.Stop(/*cancel_in_flight=*/true);
  loop.join();
}

INSTANTIATE_TEST_SUITE_P(Transports, PdLinkTest,
                         ::testing::Values(comm::TransportKind::kShm, comm::TransportKind::kTcp),
                         [](const auto& info) {
                           return std::string(comm::TransportKindName(info.param));
                         });

}  // namespace
}  // namespace tessera::serve
