// Messenger (messenger.h): receives. Parses each peer's incoming frames
// (message_frame.h), matches a message to the first posted receive with its tag
// (in order per peer and tag), buffers it when a receive with another tag is
// waiting behind it, and delivers payloads by copy or by reduction straight out of
// the Channel, the sender's memory or its shared buffer (messenger_single_copy.cc).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/message_frame.h"
#include "comm/messenger.h"
#include "comm/reduce.h"

namespace tessera::comm {
namespace {

using frame::kBurstBytes;
using frame::kCopyFrameMagic;
using frame::kCopyHeaderBytes;
using frame::kDelayChunkMagic;
using frame::kFrameMagic;
using frame::kHeaderBytes;
using frame::kWindowFrameMagic;
using frame::kWindowHeaderBytes;
using frame::PadFor;

}  // namespace

void Messenger::ReduceIntoOp(RecvOp* op, uint64_t offset, const uint8_t* in, size_t bytes) {
  uint8_t* dst = static_cast<uint8_t*>(op->data) + offset;
  const uint8_t* base =
      op->reduce_base != nullptr ? static_cast<const uint8_t*>(op->reduce_base) + offset : dst;
  ReduceTwo(dst, base, in, bytes / DataTypeSize(op->dtype), op->dtype, op->op);
}

Status Messenger::Deliver(int peer, RecvOp* op, const uint8_t* data, size_t size) {
  if (op->mode == RecvMode::kReduce) {
    if (size != op->capacity) {
      return InvalidArgumentError("sent " + std::to_string(size) + " bytes for a " +
                                  std::to_string(op->capacity) + "-byte reducing receive (tag " +
                                  std::to_string(op->tag) + ")");
    }
    ReduceIntoOp(op, 0, data, size);
  } else if (size > 0) {
    std::memcpy(op->data, data, size);
  }
  op->received = size;
  op->done = true;
  ledger_.mutable_entry(op->primitive).bytes_received += size;
  return Status::Ok();
}

Status Messenger::MatchParked(int peer, PeerState& ps) {
  // Header parsed; find the first posted receive with this tag.
  for (auto it = ps.recvs.begin(); it != ps.recvs.end(); ++it) {
    RecvOp* op = *it;
    if (op->tag != ps.in_tag) continue;
    if (ps.in_size > op->capacity ||
        (op->mode == RecvMode::kReduce && ps.in_size != op->capacity)) {
      return InvalidArgumentError("sent a " + std::to_string(ps.in_size) + "-byte message for a " +
                                  std::to_string(op->capacity) + "-byte receive (tag " +
                                  std::to_string(op->tag) + ")");
    }
    ps.recvs.erase(it);
    ps.in_op = op;
    ps.in = PeerState::In::kPayload;
    return Status::Ok();
  }
  if (!ps.recvs.empty()) {
    // A receive with another tag is posted behind this message: buffer it.
    if (ps.in_size > options_.unexpected_limit_bytes -
                         std::min(unexpected_bytes_, options_.unexpected_limit_bytes)) {
      return ResourceExhaustedError("sent a " + std::to_string(ps.in_size) + "-byte message (tag " +
                                    std::to_string(ps.in_tag) +
                                    ") that no posted receive matches, and buffering it would " +
                                    "exceed TESSERA_COMM_UNEXPECTED_BYTES");
    }
    unexpected_bytes_ += ps.in_size;
    ps.unexpected.push_back(Unexpected{ps.in_tag, ps.in_size, {}, false, nullptr});
    ps.in_unexpected = &ps.unexpected.back();
    ps.in = PeerState::In::kPayload;
  }
  return Status::Ok();  // otherwise stay parked until a receive is posted
}

Status Messenger::DeliverBuffered(int peer, PeerState& ps) {
  for (Unexpected& u : ps.unexpected) {
    if (!u.complete || u.waiting == nullptr) continue;
    if (u.size > u.waiting->capacity ||
        (u.waiting->mode == RecvMode::kReduce && u.size != u.waiting->capacity)) {
      return InvalidArgumentError("sent a " + std::to_string(u.size) + "-byte message for a " +
                                  std::to_string(u.waiting->capacity) + "-byte receive (tag " +
                                  std::to_string(u.tag) + ")");
    }
    TESSERA_RETURN_IF_ERROR(Deliver(peer, u.waiting, u.data.data(), u.size));
    unexpected_bytes_ -= u.size;
    u.waiting = nullptr;
    u.delivered = true;
    std::vector<uint8_t>().swap(u.data);
  }
  // Only from the front: the entry being received (in_unexpected) stays in place.
  while (!ps.unexpected.empty() && ps.unexpected.front().delivered) ps.unexpected.pop_front();
  return Status::Ok();
}

Result<bool> Messenger::ProgressRecvs(int peer, PeerState& ps) {
  Channel& ch = *channels_[peer];
  bool progressed = false;
  size_t budget = kBurstBytes;
  while (true) {
    switch (ps.in) {
      case PeerState::In::kHeader: {
        if (ps.recvs.empty() && ps.in_header_have == 0) return progressed;  // nothing wanted
        TESSERA_ASSIGN_OR_RETURN(auto span, ch.Peek());
        if (span.empty()) return progressed;
        // A single-copy descriptor's header is longer (its magic says so).
        auto header_bytes = [&ps] {
          uint32_t m = 0;
          std::memcpy(&m, ps.in_header, 4);
          if (ps.in_header_have < 4) return kHeaderBytes;
          return m == kCopyFrameMagic     ? kCopyHeaderBytes
                 : m == kWindowFrameMagic ? kWindowHeaderBytes
                                          : kHeaderBytes;
        };
        size_t n = std::min(span.size(), header_bytes() - ps.in_header_have);
        std::memcpy(ps.in_header + ps.in_header_have, span.data(), n);
        ch.Consume(n);
        ps.in_header_have += n;
        progressed = true;
        if (ps.in_header_have < header_bytes()) break;
        ps.in_header_have = 0;
        uint32_t magic = 0;
        std::memcpy(&magic, ps.in_header, 4);
        std::memcpy(&ps.in_tag, ps.in_header + 4, 4);
        std::memcpy(&ps.in_size, ps.in_header + 8, 8);
        ps.in_copy = magic == kCopyFrameMagic || magic == kWindowFrameMagic;
        if (ps.in_copy) {
          if (peers_[peer].shm_control == nullptr || peers_[peer].copy_acks_to == nullptr) {
            return InvalidArgumentError("sent a single-copy descriptor over " +
                                        channels_[peer]->Describe());
          }
          ps.in_copy_src = nullptr;
          if (magic == kWindowFrameMagic) {  // {buffer id, offset} in its shared buffer
            uint64_t id = 0, offset = 0;
            std::memcpy(&id, ps.in_header + 16, 8);
            std::memcpy(&offset, ps.in_header + 24, 8);
            TESSERA_ASSIGN_OR_RETURN(ps.in_copy_src, PeerWindowBytes(ps, id, offset, ps.in_size));
          } else {  // the address in its memory
            std::memcpy(&ps.in_copy_addr, ps.in_header + 16, 8);
          }
          ps.in_done = 0;
          ps.in_pad = 0;
          ps.in_op = nullptr;
          ps.in_unexpected = nullptr;
          ps.in = PeerState::In::kParked;
          break;
        }
        if (magic != kFrameMagic) {
          char hex[16];
          std::snprintf(hex, sizeof(hex), "%08x", magic);
          std::string text = std::string("sent a malformed frame (bad magic 0x") + hex + ")";
          if (magic == kDelayChunkMagic) {
            text += "; it uses TESSERA_TCP_DELAY_US, which every rank must set to the same value";
          }
          return InvalidArgumentError(text);
        }
        ps.in_done = 0;
        ps.in_pad = PadFor(ps.in_size);
        ps.in_op = nullptr;
        ps.in_unexpected = nullptr;
        ps.in = PeerState::In::kParked;
        break;
      }
      case PeerState::In::kParked:
        TESSERA_RETURN_IF_ERROR(MatchParked(peer, ps));
        if (ps.in == PeerState::In::kParked) return progressed;
        progressed = true;
        break;
      case PeerState::In::kPayload: {
        uint64_t left = ps.in_size - ps.in_done;
        if (left == 0) {
          ps.in = PeerState::In::kPad;
          break;
        }
        if (budget == 0) return progressed;
        RecvOp* op = ps.in_op;
        // A single-copy message read into its receive goes in one call, whatever its
        // size (one pinning pass of the kernel's); everything else in bursts.
        const bool whole =
            ps.in_copy && op != nullptr && (op->mode == RecvMode::kCopy || ps.in_copy_src);
        if (!whole) left = std::min<uint64_t>(left, budget);
        if (ps.in_copy_src != nullptr) {  // read from our mapping of the sender's buffer
          const size_t n = static_cast<size_t>(left);
          const uint8_t* from = ps.in_copy_src + ps.in_done;
          if (op != nullptr && op->mode == RecvMode::kCopy) {
            CopyLocal(static_cast<uint8_t*>(op->data) + ps.in_done, from, n, ps.in_size);
          } else if (op != nullptr) {
            ReduceIntoOp(op, ps.in_done, from, n);
          } else {
            ps.in_unexpected->data.insert(ps.in_unexpected->data.end(), from, from + n);
          }
          ps.in_done += n;
          budget -= std::min(budget, n);
          progressed = true;
          break;
        }
        if (ps.in_copy) {  // read straight from the sender's buffer
          const size_t n = static_cast<size_t>(left);
          const uint64_t from = ps.in_copy_addr + ps.in_done;
          if (op != nullptr && op->mode == RecvMode::kCopy) {
            TESSERA_RETURN_IF_ERROR(
                ReadPeerMemory(peer, static_cast<uint8_t*>(op->data) + ps.in_done, from, n));
          } else if (op != nullptr) {
            // kBurstBytes is a multiple of every element size, so chunks hold whole
            // elements.
            copy_scratch_.resize(kBurstBytes);
            TESSERA_RETURN_IF_ERROR(ReadPeerMemory(peer, copy_scratch_.data(), from, n));
            ReduceIntoOp(op, ps.in_done, copy_scratch_.data(), n);
          } else {
            std::vector<uint8_t>& data = ps.in_unexpected->data;
            data.resize(static_cast<size_t>(ps.in_done) + n);
            TESSERA_RETURN_IF_ERROR(ReadPeerMemory(peer, data.data() + ps.in_done, from, n));
          }
          ps.in_done += n;
          budget -= std::min(budget, n);  // a whole message may exceed it
          progressed = true;
          break;
        }
        if (op != nullptr && op->mode == RecvMode::kCopy) {
          TESSERA_ASSIGN_OR_RETURN(size_t n,
                                   ch.ReadInto(static_cast<uint8_t*>(op->data) + ps.in_done, left,
                                               BypassesCache(ps.in_size)));
          if (n == 0) return progressed;
          ps.in_done += n;
          budget -= n;
          progressed = true;
          break;
        }
        TESSERA_ASSIGN_OR_RETURN(auto span, ch.Peek());
        size_t n = static_cast<size_t>(std::min<uint64_t>(span.size(), left));
        if (op != nullptr) {
          const size_t esize = DataTypeSize(op->dtype);
          n -= n % esize;
          if (n == 0) return progressed;
          ReduceIntoOp(op, ps.in_done, span.data(), n);
        } else {
          if (n == 0) return progressed;
          ps.in_unexpected->data.insert(ps.in_unexpected->data.end(), span.data(), span.data() + n);
        }
        ch.Consume(n);
        ps.in_done += n;
        budget -= n;
        progressed = true;
        break;
      }
      case PeerState::In::kPad: {
        if (ps.in_pad > 0) {
          TESSERA_ASSIGN_OR_RETURN(auto span, ch.Peek());
          size_t n = std::min(span.size(), ps.in_pad);
          if (n == 0) return progressed;
          ch.Consume(n);
          ps.in_pad -= n;
          progressed = true;
          if (ps.in_pad > 0) break;
        }
        ps.in = PeerState::In::kHeader;
        if (ps.in_copy) {  // tell the sender its buffer is free
          ps.in_copy = false;
          ps.in_copy_src = nullptr;
          peers_[peer].copy_acks_to->store(++ps.copy_read, std::memory_order_release);
          WakeIfSleeping(peers_[peer].shm_control);
        }
        if (ps.in_op != nullptr) {
          ps.in_op->received = ps.in_size;
          ps.in_op->done = true;
          ledger_.mutable_entry(ps.in_op->primitive).bytes_received += ps.in_size;
          ps.in_op = nullptr;
        } else if (ps.in_unexpected != nullptr) {
          Unexpected* u = ps.in_unexpected;
          u->complete = true;
          ps.in_unexpected = nullptr;
          // A receive may have been posted for it meanwhile.
          if (u->waiting == nullptr) {
            for (auto it = ps.recvs.begin(); it != ps.recvs.end(); ++it) {
              if ((*it)->tag == u->tag) {
                u->waiting = *it;
                ps.recvs.erase(it);
                break;
              }
            }
          }
        }
        // Deliver completed buffered messages that have their receive now.
        TESSERA_RETURN_IF_ERROR(DeliverBuffered(peer, ps));
        break;
      }
    }
  }
}

}  // namespace tessera::comm
