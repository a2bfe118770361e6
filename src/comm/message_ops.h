// The operations posted to a Messenger (messenger.h): SendOp sends one tagged
// message to a peer, RecvOp receives one into a buffer, by copy or by reduction.
// Layer: comm; built by the communicator (point to point) and algorithms/, which
// own them and keep them alive until done. Plain data: the messenger updates their
// progress.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/ledger.h"
#include "comm/types.h"

namespace tessera::comm {

struct Op {
  bool done = false;
  Primitive primitive = Primitive::kCount;  // ledger entry; set when posted
};

// Send `bytes` from `data` (borrowed until done) to `peer` with `tag`.
struct SendOp : Op {
  SendOp() = default;
  SendOp(int peer_in, int32_t tag_in, const void* data_in, size_t bytes_in)
      : peer(peer_in), tag(tag_in), data(data_in), bytes(bytes_in) {}
  int peer = -1;
  int32_t tag = 0;
  const void* data = nullptr;
  size_t bytes = 0;
  size_t progress = 0;  // stream bytes written (header + payload + padding)
  // The receive it matches copies (not reduces) and is posted within the same
  // collective step: a large message may then go as single copy. Collectives set it.
  bool allow_single_copy = false;
  uint64_t copy_seq = 0;  // single copy: our n-th such message to the peer (0 = streamed)
  // A collective's message whose receive copies or reduces: when `data` lies in one of
  // our shared buffers (Communicator::AllocateShared) and the peer is on this host, it
  // goes as a descriptor {buffer, offset} and the peer reads it straight from its
  // mapping of that buffer. Copy() sets it; ring reductions set it with Reducing().
  bool allow_window = false;
  // Also copy the bytes to `tee` (bytes long, not overlapping data; borrowed until done)
  // as they are sent: a streamed chunk is copied right after the transport read it, so
  // the second read comes from the cache (an all-gather's own block: its output copy).
  void* tee = nullptr;

  static SendOp Copy(int peer, int32_t tag, const void* data, size_t bytes) {
    SendOp op(peer, tag, data, bytes);
    op.allow_single_copy = true;
    op.allow_window = true;
    return op;
  }
  static SendOp Reducing(int peer, int32_t tag, const void* data, size_t bytes) {
    SendOp op(peer, tag, data, bytes);
    op.allow_window = true;
    return op;
  }
};

enum class RecvMode : uint8_t { kCopy, kReduce };

// Receive at most `capacity` bytes from `peer` with `tag` into `data`. In kReduce
// mode: data[i] = op(base[i], incoming[i]) with base = `reduce_base` (or `data`
// itself when null); the message must then be exactly `capacity` bytes.
struct RecvOp : Op {
  RecvOp() = default;
  RecvOp(int peer_in, int32_t tag_in, void* data_in, size_t capacity_in)
      : peer(peer_in), tag(tag_in), data(data_in), capacity(capacity_in) {}
  static RecvOp Reduce(int peer, int32_t tag, void* data, size_t bytes, DataType dtype, ReduceOp op,
                       const void* base = nullptr) {
    RecvOp r(peer, tag, data, bytes);
    r.mode = RecvMode::kReduce;
    r.dtype = dtype;
    r.op = op;
    r.reduce_base = base;
    return r;
  }
  int peer = -1;
  int32_t tag = 0;
  void* data = nullptr;
  size_t capacity = 0;
  RecvMode mode = RecvMode::kCopy;
  DataType dtype = DataType::kU8;
  ReduceOp op = ReduceOp::kSum;
  const void* reduce_base = nullptr;
  size_t received = 0;  // payload bytes delivered so far; the message size once done
};

}  // namespace tessera::comm
