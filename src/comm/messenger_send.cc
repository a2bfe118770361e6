// Messenger (messenger.h): sends. Each peer's posted sends go out in order as
// frames (message_frame.h): streamed through the Channel in bursts, or, for a
// collective's large message the peer can read in place, as a descriptor whose
// completion waits for the peer's acknowledgement (messenger_single_copy.cc).
#include <algorithm>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "comm/message_frame.h"
#include "comm/messenger.h"

namespace tessera::comm {
namespace {

using frame::kBurstBytes;
using frame::kCopyFrameMagic;
using frame::kCopyHeaderBytes;
using frame::kFrameMagic;
using frame::kHeaderBytes;
using frame::kSmallMessageBytes;
using frame::kWindowFrameMagic;
using frame::kWindowHeaderBytes;
using frame::PadFor;

}  // namespace

Result<bool> Messenger::ProgressSends(int peer, PeerState& ps) {
  Channel& ch = *channels_[peer];
  bool progressed = false;
  size_t budget = kBurstBytes;
  while (!ps.sends.empty()) {
    SendOp* op = ps.sends.front();
    // A collective's message in one of our shared buffers goes as a descriptor
    // {header, buffer, offset} to a same-host peer, which reads it from its mapping.
    std::optional<WindowTable::Hit> window;
    if (op->allow_window && options_.window_copy_bytes > 0 &&
        op->bytes >= options_.window_copy_bytes && peers_[peer].copy_acks_from != nullptr &&
        !windows_->empty()) {
      window = windows_->Find(op->data, op->bytes);
    }
    // Single copy: a collective's large message to a peer that can read our memory
    // goes as a descriptor {header, address}; the peer copies straight from op->data.
    const size_t max_bytes = op->primitive == Primitive::kAllReduce
                                 ? options_.single_copy_allreduce_max_bytes
                                 : options_.single_copy_max_bytes;
    const bool by_address = !window && op->allow_single_copy && options_.single_copy_bytes > 0 &&
                            op->bytes >= options_.single_copy_bytes && op->bytes < max_bytes &&
                            peers_[peer].reads_us;
    const bool single_copy = window || by_address;  // the peer reads op->data itself
    const size_t pad = single_copy ? 0 : PadFor(op->bytes);
    const size_t total = window       ? kWindowHeaderBytes
                         : by_address ? kCopyHeaderBytes
                                      : kHeaderBytes + op->bytes + pad;
    if (op->progress == 0) {
      uint32_t magic = window ? kWindowFrameMagic : by_address ? kCopyFrameMagic : kFrameMagic;
      uint64_t size = op->bytes;
      std::memcpy(ps.out_header, &magic, 4);
      std::memcpy(ps.out_header + 4, &op->tag, 4);
      std::memcpy(ps.out_header + 8, &size, 8);
      if (window) {
        std::memcpy(ps.out_header + 16, &window->id, 8);
        std::memcpy(ps.out_header + 24, &window->offset, 8);
      } else {
        const uint64_t address = reinterpret_cast<uintptr_t>(op->data);
        std::memcpy(ps.out_header + 16, &address, 8);
      }
    }
    while (op->progress < total) {
      size_t wrote = 0;
      const size_t before = op->progress;
      if (single_copy) {
        TESSERA_ASSIGN_OR_RETURN(wrote,
                                 ch.Write(ps.out_header + op->progress, total - op->progress));
      } else if (op->progress == 0 && total <= kSmallMessageBytes) {
        uint8_t frame[kSmallMessageBytes];
        std::memcpy(frame, ps.out_header, kHeaderBytes);
        if (op->bytes > 0) std::memcpy(frame + kHeaderBytes, op->data, op->bytes);
        std::memset(frame + kHeaderBytes + op->bytes, 0, pad);
        TESSERA_ASSIGN_OR_RETURN(wrote, ch.Write(frame, total));
        if (wrote != 0 && wrote != total) {
          // The transport took part of it; continue piecewise below.
        }
      } else if (op->progress < kHeaderBytes) {
        TESSERA_ASSIGN_OR_RETURN(
            wrote, ch.Write(ps.out_header + op->progress, kHeaderBytes - op->progress));
      } else if (op->progress < kHeaderBytes + op->bytes) {
        if (budget == 0) break;
        size_t off = op->progress - kHeaderBytes;
        TESSERA_ASSIGN_OR_RETURN(wrote, ch.Write(static_cast<const uint8_t*>(op->data) + off,
                                                 std::min(op->bytes - off, budget)));
        budget -= wrote;
      } else {
        static const uint8_t kZeros[8] = {0};
        TESSERA_ASSIGN_OR_RETURN(wrote, ch.Write(kZeros, total - op->progress));
      }
      if (wrote == 0) break;
      op->progress += wrote;
      progressed = true;
      if (op->tee != nullptr && !single_copy) TeePayload(*op, before, op->progress);
    }
    if (op->progress < total) break;
    ps.sends.pop_front();
    if (single_copy) {  // done once the peer has read it (CompleteCopies)
      op->copy_seq = ++ps.copy_sent;
      if (window) ++in_place_sends_;
      ps.copy_sends.push_back(op);
      if (op->tee != nullptr) {  // the peer reads op->data meanwhile: tell it first
        ch.NotifyPeer();
        CopyLocal(op->tee, op->data, op->bytes);
      }
      continue;
    }
    op->done = true;
    ledger_.mutable_entry(op->primitive).bytes_sent += op->bytes;
  }
  if (progressed) ch.NotifyPeer();
  return progressed;
}

void Messenger::TeePayload(const SendOp& op, size_t from, size_t to) const {
  // Stream positions [from, to) → payload bytes [begin, end).
  const size_t begin = std::clamp(from, kHeaderBytes, kHeaderBytes + op.bytes) - kHeaderBytes;
  const size_t end = std::clamp(to, kHeaderBytes, kHeaderBytes + op.bytes) - kHeaderBytes;
  if (end <= begin) return;
  CopyLocal(static_cast<uint8_t*>(op.tee) + begin, static_cast<const uint8_t*>(op.data) + begin,
            end - begin, op.bytes);
}

}  // namespace tessera::comm
