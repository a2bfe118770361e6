// libFuzzer target for the TCP transport's TLS glue (comm/transport/tls_channel.h):
// OpenSSL decodes the records; this checks what tessera does around it. The first
// byte picks the mode:
//   0: the rest is a peer's wire to a TLS client or server that has not finished
//      its handshake: without the pre-shared key no handshake can complete, so
//      it must end in an error (or wait for more) and not one byte may come out;
//   1: a real handshake between two channels over in-memory pipes, then a stream
//      written through one (partial writes of sizes from the input) and read on the
//      other in pieces: every byte must come back, in order;
//   2: as 1, with one bit of the records flipped or the records cut short: what
//      comes out must be a strict prefix of the stream (then an error, or a wait
//      for the rest of a record whose length was cut or flipped upwards).
// Never a crash, hang or read past the buffers. Corpus: fuzz/corpus/tls.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "comm/transport/tls_channel.h"
#include "fuzz_check.h"
#include "memory_channel.h"

namespace {

using tessera::fuzz::Size;

using tessera::comm::Channel;
using tessera::comm::SessionKeys;
using tessera::comm::TlsChannel;
using tessera::fuzz::MemoryChannel;

SessionKeys Keys() {
  SessionKeys k;
  for (size_t i = 0; i < 32; ++i) k.tls_psk[i] = static_cast<uint8_t>(0x40 + i);
  return k;
}

// One direction of an in-memory connection.
struct Pipe {
  std::vector<uint8_t> bytes;
  size_t read = 0;
};

// A Channel writing into `out` (as many bytes a call as the input says) and
// reading from `in` (in pieces of sizes from the input). Never closes.
class PipeChannel : public Channel {
 public:
  PipeChannel(Pipe& in, Pipe& out, FuzzedDataProvider& fdp) : in_(in), out_(out), fdp_(fdp) {}
  tessera::Result<size_t> Write(const void* data, size_t size) override {
    const size_t n = std::min(size, Size(fdp_, 20'000));
    const uint8_t* p = static_cast<const uint8_t*>(data);
    out_.bytes.insert(out_.bytes.end(), p, p + n);
    return n;
  }
  tessera::Result<std::span<const uint8_t>> Peek() override {
    const size_t left = in_.bytes.size() - in_.read;
    const size_t n = left == 0 ? 0 : std::min(left, Size(fdp_, 20'000));
    return std::span<const uint8_t>(in_.bytes.data() + in_.read, n);
  }
  void Consume(size_t size) override { in_.read += size; }
  std::string Describe() const override { return "pipe"; }

 private:
  Pipe& in_;
  Pipe& out_;
  FuzzedDataProvider& fdp_;
};

std::unique_ptr<TlsChannel> Tls(std::unique_ptr<Channel> inner, TlsChannel::Role role) {
  auto channel = TlsChannel::Create(std::move(inner), Keys(), role);
  Require(channel.ok());
  return std::move(*channel);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  FuzzedDataProvider fdp(data + 1, size - 1);
  if (mode == 0) {
    const auto role = fdp.ConsumeBool() ? TlsChannel::Role::kClient : TlsChannel::Role::kServer;
    std::vector<uint8_t> wire = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange(0, 1 << 16));
    const bool close_at_end = fdp.ConsumeBool();
    auto tls = Tls(std::make_unique<MemoryChannel>(
                       std::move(wire), [&fdp] { return Size(fdp, 20'000); },
                       [&fdp] { return Size(fdp, 20'000); }, close_at_end),
                   role);
    for (int i = 0; i < 64; ++i) {
      auto done = tls->StepHandshake();
      if (!done.ok()) break;
      Require(!*done);  // no key, no handshake
    }
    auto span = tls->Peek();
    Require(!span.ok() || span->empty());
    return 0;
  }
  Pipe to_server, to_client;
  auto client =
      Tls(std::make_unique<PipeChannel>(to_client, to_server, fdp), TlsChannel::Role::kClient);
  auto server =
      Tls(std::make_unique<PipeChannel>(to_server, to_client, fdp), TlsChannel::Role::kServer);
  bool client_done = false, server_done = false;
  for (int i = 0; i < 10'000 && !(client_done && server_done); ++i) {
    auto c = client->StepHandshake();
    auto s = server->StepHandshake();
    Require(c.ok() && s.ok());
    client_done = *c;
    server_done = *s;
  }
  Require(client_done && server_done);

  const size_t length = fdp.ConsumeIntegralInRange<size_t>(1, 100'000);
  std::vector<uint8_t> stream(length);
  const uint64_t seed = fdp.ConsumeIntegral<uint64_t>();
  for (size_t i = 0; i < length; i += 8) {
    const uint64_t word = seed ^ (i * 0x9e3779b97f4a7c15ull);
    std::memcpy(stream.data() + i, &word, std::min<size_t>(8, length - i));
  }
  const size_t records_start = to_server.bytes.size();
  for (size_t done = 0, calls = 0; done < length; ++calls) {
    Require(calls < 100'000);
    auto n = client->Write(stream.data() + done, Size(fdp, length - done));
    Require(n.ok());
    done += *n;
  }
  if (mode == 2 && to_server.bytes.size() > records_start) {
    if (fdp.ConsumeBool()) {
      to_server.bytes.resize(
          fdp.ConsumeIntegralInRange<size_t>(records_start, to_server.bytes.size() - 1));
    } else {
      const size_t at =
          fdp.ConsumeIntegralInRange<size_t>(records_start, to_server.bytes.size() - 1);
      to_server.bytes[at] ^= static_cast<uint8_t>(1u << fdp.ConsumeIntegralInRange(0, 7));
    }
  }
  std::vector<uint8_t> out;
  bool failed = false;
  for (int idle = 0; idle < 8 && out.size() < length;) {
    auto span = server->Peek();
    if (!span.ok()) {
      failed = true;
      break;
    }
    if (span->empty()) {
      ++idle;
      continue;
    }
    idle = 0;
    const size_t n = std::min(span->size(), Size(fdp, span->size()));
    out.insert(out.end(), span->data(), span->data() + n);
    server->Consume(n);
  }
  Require(out.size() <= length);
  Require(out.empty() || std::memcmp(out.data(), stream.data(), out.size()) == 0);
  if (mode == 1) Require(out.size() == length && !failed);
  if (mode == 2) Require(out.size() < length);
  return 0;
}
