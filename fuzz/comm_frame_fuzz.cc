// libFuzzer target for the messenger's frame decoder (comm/message_frame.h,
// messenger_recv.cc): what a peer's byte stream can make a receiving rank do. The
// first byte picks the mode:
//   0: the rest is the peer's stream; rank 0 posts copying and reducing receives
//      of sizes taken from the input and waits: it must complete them or fail with
//      an error, never crash, hang or allocate past its unexpected-message limit;
//   1: rank 1's messenger sends messages (tags and sizes from the input) through a
//      channel that takes partial writes; rank 0 receives them from that stream,
//      posting in another order: every payload must arrive intact;
//   2: as 1 with one bit of the stream flipped: an error or intact payloads
//      (a flipped padding byte changes nothing), never a crash.
// Corpus: fuzz/corpus/comm_frame.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/messenger.h"
#include "fuzz_check.h"
#include "memory_channel.h"

namespace {

using tessera::fuzz::Size;

using namespace tessera::comm;
using tessera::fuzz::MemoryChannel;

std::unique_ptr<Messenger> MakeMessenger(int rank, std::unique_ptr<Channel> channel) {
  std::vector<std::unique_ptr<Channel>> channels(2);
  channels[1 - rank] = std::move(channel);
  std::vector<PeerInfo> peers(2);
  peers[1 - rank].address = "fuzz:1";
  WaitOptions wait;
  wait.timeout_ms = 2000;
  wait.unexpected_limit_bytes = 1 << 20;
  return std::make_unique<Messenger>(rank, 2, std::move(channels), std::move(peers), nullptr, wait,
                                     nullptr);
}

struct Message {
  int32_t tag;
  std::vector<uint8_t> payload;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  FuzzedDataProvider fdp(data + 1, size - 1);
  if (mode == 0) {
    const int receives = fdp.ConsumeIntegralInRange(1, 4);
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<RecvOp> ops;
    ops.reserve(receives);
    for (int i = 0; i < receives; ++i) {
      const int32_t tag = fdp.ConsumeIntegralInRange(0, 3);
      const size_t capacity = fdp.ConsumeIntegralInRange<size_t>(0, 1 << 16) & ~size_t{3};
      buffers.emplace_back(capacity + 4, 0);
      if (fdp.ConsumeBool()) {
        ops.push_back(RecvOp::Reduce(1, tag, buffers.back().data(), capacity, DataType::kF32,
                                     ReduceOp::kSum));
      } else {
        ops.emplace_back(1, tag, buffers.back().data(), capacity);
      }
    }
    const size_t max_chunk = Size(fdp, 1 << 16);
    std::vector<uint8_t> wire = fdp.ConsumeRemainingBytes<uint8_t>();
    auto messenger = MakeMessenger(
        0, std::make_unique<MemoryChannel>(
               std::move(wire), [max_chunk] { return max_chunk; }, [] { return size_t{1}; }));
    if (!messenger->Begin(Primitive::kRecv).ok()) return 0;
    std::vector<Op*> all;
    for (auto& op : ops) {
      messenger->PostRecv(&op);
      all.push_back(&op);
    }
    (void)messenger->WaitAll(all);
    return 0;
  }
  // Rank 1 sends messages into a stream.
  std::vector<Message> messages(fdp.ConsumeIntegralInRange(1, 6));
  for (size_t i = 0; i < messages.size(); ++i) {
    messages[i].tag = static_cast<int32_t>(i);  // distinct: receives match by tag
    messages[i].payload.resize(fdp.ConsumeIntegralInRange<size_t>(0, 20'000));
    const uint8_t seed = fdp.ConsumeIntegral<uint8_t>();
    for (size_t j = 0; j < messages[i].payload.size(); ++j) {
      messages[i].payload[j] = static_cast<uint8_t>(seed + j * 7);
    }
  }
  const size_t max_accept = Size(fdp, 30'000);
  auto sink = std::make_unique<MemoryChannel>(
      std::vector<uint8_t>(), [] { return size_t{1}; },
      [&fdp, max_accept] { return Size(fdp, max_accept); }, /*close_at_end=*/false);
  MemoryChannel* wire = sink.get();
  std::vector<uint8_t> bytes;
  {
    auto sender = MakeMessenger(1, std::move(sink));
    Require(sender->Begin(Primitive::kSend).ok());
    std::vector<SendOp> sends;
    sends.reserve(messages.size());
    std::vector<Op*> all;
    for (const auto& m : messages) {
      sends.emplace_back(0, m.tag, m.payload.data(), m.payload.size());
      sender->PostSend(&sends.back());
      all.push_back(&sends.back());
    }
    Require(sender->WaitAll(all).ok());
    bytes = wire->written;  // the sender owns the channel
  }
  if (mode == 2) {
    const size_t at = fdp.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
    bytes[at] ^= static_cast<uint8_t>(1u << fdp.ConsumeIntegralInRange(0, 7));
  }
  // Rank 0 receives them, posting in an order from the input (the others wait as
  // unexpected messages meanwhile).
  std::vector<size_t> order(messages.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[fdp.ConsumeIntegralInRange<size_t>(0, i - 1)]);
  }
  const size_t max_chunk = Size(fdp, 1 << 16);
  auto receiver = MakeMessenger(
      0, std::make_unique<MemoryChannel>(
             std::move(bytes), [max_chunk] { return max_chunk; }, [] { return size_t{1}; },
             // Intact: every receive completes from the stream (earlier ones from the
             // unexpected-message buffer after it ends). Flipped: a receive may wait
             // for a message that never comes; the end of the stream fails it at once.
             /*close_at_end=*/mode == 2));
  std::vector<std::vector<uint8_t>> got(messages.size());
  bool failed = false;
  for (size_t i : order) {
    got[i].assign(messages[i].payload.size(), 0);
    RecvOp op(1, messages[i].tag, got[i].data(), got[i].size());
    if (!receiver->Begin(Primitive::kRecv).ok()) {
      failed = true;
      break;
    }
    receiver->PostRecv(&op);
    if (tessera::Status s = receiver->WaitAll({&op}); !s.ok()) {
      if (mode == 1) std::fprintf(stderr, "receive failed: %s\n", s.ToString().c_str());
      failed = true;
      break;
    }
    if (mode == 1) Require(op.received == messages[i].payload.size());
    // A flipped payload bit arrives as sent (no checksum at this layer: the TCP
    // transport's MAC catches it below); anything else must be intact.
    if (mode == 1) Require(got[i] == messages[i].payload);
  }
  if (mode == 1) Require(!failed);
  return 0;
}
