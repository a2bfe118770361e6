// libFuzzer target for the rendezvous wire (comm/rendezvous): the TCP store's
// requests and replies (store_protocol.h) and the cluster-token handshake
// (auth.h). The first byte picks the mode:
//   0: the rest is a client's request stream, served against an in-memory store
//      (Get never waits) until it ends or is refused;
//   1: the rest is a store's reply stream, decoded until it ends or is refused;
//   2: a request and a reply built from the bytes must decode to themselves;
//   3: the rest is what a peer sends in the handshake, to a client or a server:
//      without the token nobody gets in (the handshake must fail).
// Never a crash, hang or an allocation by an announced length alone.
// Corpus: fuzz/corpus/store.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/hash_store.h"
#include "comm/rendezvous/store_protocol.h"
#include "fuzz_check.h"

namespace {

using namespace tessera::comm;
namespace sp = tessera::comm::store_protocol;

sp::ReadExactly FromBytes(std::span<const uint8_t> bytes, size_t* pos) {
  return [bytes, pos](void* dst, size_t size) -> tessera::Status {
    if (bytes.size() - *pos < size) return tessera::UnavailableError("end of input");
    std::memcpy(dst, bytes.data() + *pos, size);
    *pos += size;
    return tessera::Status::Ok();
  };
}

void Serve(std::span<const uint8_t> bytes) {
  HashStore store;
  size_t pos = 0;
  auto read = FromBytes(bytes, &pos);
  while (true) {
    auto request = sp::ReadRequest(read);
    if (!request.ok()) return;
    switch (request->command) {
      case sp::kSet:
        Require(store.Set(request->key, request->value).ok());
        break;
      case sp::kGet:
        (void)store.Get(request->key, tessera::Deadline::AfterMs(0));
        break;
      case sp::kAdd:
        (void)store.Add(request->key, request->number);
        break;
    }
  }
}

// The handshake with a peer that says `bytes` and then stops talking.
void Handshake(std::span<const uint8_t> bytes, bool as_server) {
  int fds[2];
  Require(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  if (!bytes.empty()) Require(::write(fds[1], bytes.data(), bytes.size()) == (ssize_t)bytes.size());
  ::shutdown(fds[1], SHUT_WR);  // then end of stream, so nothing waits for more
  const auto deadline = tessera::Deadline::AfterMs(1000);
  SessionKeys keys;
  tessera::Status s = as_server ? AuthenticateAsServer(fds[0], "token", deadline, &keys)
                                : AuthenticateAsClient(fds[0], "token", deadline, &keys);
  Require(!s.ok());
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  std::span<const uint8_t> rest(data + 1, size - 1);
  switch (mode) {
    case 0:
      Serve(rest);
      break;
    case 1: {
      size_t pos = 0;
      auto read = FromBytes(rest, &pos);
      while (sp::ReadReply(read).ok()) {
      }
      break;
    }
    case 2: {
      FuzzedDataProvider fdp(rest.data(), rest.size());
      sp::Request request;
      request.command = static_cast<sp::Command>(fdp.ConsumeIntegralInRange(1, 3));
      request.key = fdp.ConsumeRandomLengthString(4096);
      if (request.command == sp::kSet) {
        request.value = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange(0, 4096));
      } else {
        request.number = fdp.ConsumeIntegral<int64_t>();
      }
      sp::Reply reply;
      reply.code = static_cast<sp::ReplyCode>(fdp.ConsumeIntegralInRange(0, 2));
      reply.payload = fdp.ConsumeRemainingBytes<uint8_t>();
      std::vector<uint8_t> wire = sp::EncodeRequest(request);
      size_t pos = 0;
      auto back = sp::ReadRequest(FromBytes(wire, &pos));
      Require(back.ok() && pos == wire.size() && back->command == request.command &&
              back->key == request.key && back->value == request.value &&
              back->number == request.number);
      wire = sp::EncodeReply(reply);
      pos = 0;
      auto reply_back = sp::ReadReply(FromBytes(wire, &pos));
      Require(reply_back.ok() && pos == wire.size() && reply_back->code == reply.code &&
              reply_back->payload == reply.payload);
      break;
    }
    case 3:
      // Socket buffers hold this much without blocking the writer.
      if (rest.size() > 2 && rest.size() <= 4096) Handshake(rest.subspan(1), rest[0] & 1);
      break;
  }
  return 0;
}
