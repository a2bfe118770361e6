// libFuzzer target for the TCP transport's authenticated-frame decoder
// (comm/transport/authenticated_channel.h). The first byte picks the mode:
//   0: the rest is the wire from the peer: raw bytes cannot carry a valid tag, so
//      not one byte may come out, only an error;
//   1: the rest is a stream written through an AuthenticatedChannel (partial writes
//      of sizes taken from the input) and read back in pieces: every byte must
//      come back, in order, then the stream's end;
//   2: as 1, then one wire bit flipped or the wire cut short: what comes out must be
//      a prefix of the stream (checked records only), and an error must follow.
// Never a crash, hang or read past the buffers. Corpus: fuzz/corpus/frame_auth.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/transport/authenticated_channel.h"
#include "fuzz_check.h"
#include "memory_channel.h"

namespace {

using tessera::fuzz::Size;

using tessera::comm::AuthenticatedChannel;
using tessera::comm::SessionKeys;
using tessera::fuzz::MemoryChannel;

SessionKeys Keys() {
  SessionKeys k;
  for (size_t i = 0; i < 32; ++i) {
    k.send[i] = static_cast<uint8_t>(i);
    k.recv[i] = static_cast<uint8_t>(0x80 + i);
  }
  return k;
}

SessionKeys Mirror(const SessionKeys& k) { return SessionKeys{.send = k.recv, .recv = k.send}; }

// Reads everything the channel hands out until it fails; true when it ended with
// the inner stream's end ("closed") rather than a decoding error.
bool ReadAll(AuthenticatedChannel& reader, FuzzedDataProvider& fdp, std::vector<uint8_t>* out) {
  while (true) {
    if (fdp.ConsumeBool()) {
      uint8_t buf[512];
      auto n = reader.ReadInto(buf, Size(fdp, sizeof(buf)), false);
      if (!n.ok()) return n.status().message().find("closed the connection") == 0;
      out->insert(out->end(), buf, buf + *n);
      continue;
    }
    auto span = reader.Peek();
    if (!span.ok()) return span.status().message().find("closed the connection") == 0;
    Require(!span->empty());  // the memory channel always has more or is closed
    const size_t n = Size(fdp, span->size());
    out->insert(out->end(), span->data(), span->data() + n);
    reader.Consume(n);
  }
}

std::function<size_t()> Sizes(FuzzedDataProvider& fdp, size_t max) {
  return [&fdp, max] { return Size(fdp, max); };
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  FuzzedDataProvider fdp(data + 1, size - 1);
  if (mode == 0) {
    std::vector<uint8_t> wire = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange(0, 1 << 17));
    AuthenticatedChannel reader(
        std::make_unique<MemoryChannel>(std::move(wire), Sizes(fdp, 70000), Sizes(fdp, 1)), Keys());
    std::vector<uint8_t> out;
    ReadAll(reader, fdp, &out);
    Require(out.empty());
    return 0;
  }
  // The stream and how it is written.
  // Up to a little over two records.
  const size_t length = fdp.ConsumeIntegralInRange<size_t>(1, 140'000);
  std::vector<uint8_t> stream(length);
  const uint64_t seed = fdp.ConsumeIntegral<uint64_t>();
  for (size_t i = 0; i < length; i += 8) {  // distinct 8-byte words
    const uint64_t word = seed ^ (i * 0x9e3779b97f4a7c15ull);
    std::memcpy(stream.data() + i, &word, std::min<size_t>(8, length - i));
  }
  auto sink =
      std::make_unique<MemoryChannel>(std::vector<uint8_t>(), Sizes(fdp, 1), Sizes(fdp, 100'000));
  MemoryChannel* wire = sink.get();
  AuthenticatedChannel writer(std::move(sink), Keys());
  for (size_t done = 0; done < length;) {
    const size_t offer = Size(fdp, length - done);
    auto n = writer.Write(stream.data() + done, offer);
    Require(n.ok() && *n <= offer);
    done += *n;
  }
  std::vector<uint8_t> bytes = wire->written;
  if (mode == 2) {
    if (fdp.ConsumeBool()) {
      bytes.resize(fdp.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1));
    } else {
      const size_t at = fdp.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
      bytes[at] ^= static_cast<uint8_t>(1u << fdp.ConsumeIntegralInRange(0, 7));
    }
  }
  AuthenticatedChannel reader(
      std::make_unique<MemoryChannel>(std::move(bytes), Sizes(fdp, 70'000), Sizes(fdp, 1)),
      Mirror(Keys()));
  std::vector<uint8_t> out;
  const bool clean_end = ReadAll(reader, fdp, &out);
  Require(out.size() <= stream.size());
  Require(out.empty() || std::memcmp(out.data(), stream.data(), out.size()) == 0);
  if (mode == 1) {
    Require(clean_end && out.size() == stream.size());
  } else {
    Require(out.size() < stream.size() || !clean_end);
  }
  return 0;
}
