// The TCP store's wire protocol, decoded from a byte source (a socket in
// tcp_store.cc, a buffer in fuzz/store_fuzz.cc). A request is {command (1 byte),
// key length (4 bytes), key, then per command: Set: value length (8 bytes), value;
// Get: timeout in ms (8 bytes, < 0 = none); Add: delta (8 bytes)}. A reply is
// {code (1 byte), payload length (8 bytes), payload}. Keys are at most 4 KiB and
// values 64 MiB; values are read incrementally, so an announced length alone never
// allocates. Layer: comm. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::comm::store_protocol {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum ReplyCode : uint8_t { kReplyOk = 0, kReplyDeadline = 1, kReplyInvalid = 2 };

// Reads exactly `size` bytes into `dst` or fails.
using ReadExactly = std::function<Status(void* dst, size_t size)>;

struct Request {
  Command command = kSet;
  std::string key;
  std::vector<uint8_t> value;  // Set
  int64_t number = 0;          // Get: timeout in ms; Add: delta
};

struct Reply {
  ReplyCode code = kReplyOk;
  std::vector<uint8_t> payload;
};

// InvalidArgument (its message fit to send back to the client) for an oversized
// key or value or an unknown command; the reader's error when bytes run out.
Result<Request> ReadRequest(const ReadExactly& read);
std::vector<uint8_t> EncodeRequest(const Request& request);
// InvalidArgument for an oversized payload or an unknown code.
Result<Reply> ReadReply(const ReadExactly& read);
std::vector<uint8_t> EncodeReply(const Reply& reply);

}  // namespace tessera::comm::store_protocol
