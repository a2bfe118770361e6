#include "comm/rendezvous/store_protocol.h"

#include <algorithm>
#include <cstring>

#include "comm/rendezvous/store.h"

namespace tessera::comm::store_protocol {
namespace {

void AppendU64(std::vector<uint8_t>* out, uint64_t v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  out->insert(out->end(), b, b + 8);
}

// Reads `size` bytes into `out`, growing it as the bytes arrive (never by the
// announced size up front).
Status ReadIncrementally(const ReadExactly& read, size_t size, std::vector<uint8_t>* out) {
  out->clear();
  uint8_t buf[65536];
  while (out->size() < size) {
    size_t n = std::min(sizeof(buf), size - out->size());
    TESSERA_RETURN_IF_ERROR(read(buf, n));
    out->insert(out->end(), buf, buf + n);
  }
  return Status::Ok();
}

}  // namespace

Result<Request> ReadRequest(const ReadExactly& read) {
  uint8_t head[5];
  TESSERA_RETURN_IF_ERROR(read(head, sizeof(head)));
  uint32_t key_len = 0;
  std::memcpy(&key_len, head + 1, 4);
  if (key_len > kMaxStoreKeyBytes) return InvalidArgumentError("key too long");
  Request r;
  r.key.resize(key_len);
  TESSERA_RETURN_IF_ERROR(read(r.key.data(), key_len));
  switch (head[0]) {
    case kSet: {
      r.command = kSet;
      uint64_t len = 0;
      TESSERA_RETURN_IF_ERROR(read(&len, 8));
      if (len > kMaxStoreValueBytes) return InvalidArgumentError("value too large");
      TESSERA_RETURN_IF_ERROR(ReadIncrementally(read, len, &r.value));
      return r;
    }
    case kGet:
    case kAdd:
      r.command = static_cast<Command>(head[0]);
      TESSERA_RETURN_IF_ERROR(read(&r.number, 8));
      return r;
    default:
      return InvalidArgumentError("unknown command");
  }
}

std::vector<uint8_t> EncodeRequest(const Request& request) {
  std::vector<uint8_t> out;
  out.push_back(request.command);
  const uint32_t key_len = static_cast<uint32_t>(request.key.size());
  uint8_t b[4];
  std::memcpy(b, &key_len, 4);
  out.insert(out.end(), b, b + 4);
  out.insert(out.end(), request.key.begin(), request.key.end());
  if (request.command == kSet) {
    AppendU64(&out, request.value.size());
    out.insert(out.end(), request.value.begin(), request.value.end());
  } else {
    AppendU64(&out, static_cast<uint64_t>(request.number));
  }
  return out;
}

Result<Reply> ReadReply(const ReadExactly& read) {
  uint8_t head[9];
  TESSERA_RETURN_IF_ERROR(read(head, sizeof(head)));
  uint64_t len = 0;
  std::memcpy(&len, head + 1, 8);
  if (len > kMaxStoreValueBytes) {
    return InvalidArgumentError("rendezvous store sent an oversized reply");
  }
  if (head[0] > kReplyInvalid) {
    return InvalidArgumentError("rendezvous store sent an unknown reply code " +
                                std::to_string(head[0]));
  }
  Reply reply;
  reply.code = static_cast<ReplyCode>(head[0]);
  TESSERA_RETURN_IF_ERROR(ReadIncrementally(read, len, &reply.payload));
  return reply;
}

std::vector<uint8_t> EncodeReply(const Reply& reply) {
  std::vector<uint8_t> out;
  out.push_back(reply.code);
  AppendU64(&out, reply.payload.size());
  out.insert(out.end(), reply.payload.begin(), reply.payload.end());
  return out;
}

}  // namespace tessera::comm::store_protocol
