#include "comm/messenger.h"

#include <immintrin.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "comm/copy.h"
#include "comm/reduce.h"

namespace tessera::comm {
namespace {

constexpr uint32_t kFrameMagic = 0x314d5354;  // "TSM1"
// A DelayedChannel chunk header (tcp_channel.cc), met when only the peer delays.
constexpr uint32_t kDelayChunkMagic = 0x31445354;  // "TSD1"
constexpr size_t kHeaderBytes = 16;
// A single-copy descriptor: the header (magic "TSC1") and the sender's address.
constexpr uint32_t kCopyFrameMagic = 0x31435354;  // "TSC1"
constexpr size_t kCopyHeaderBytes = 24;
// A shared-buffer descriptor: the header (magic "TSW1"), the buffer's id and the
// offset of the bytes in it.
constexpr uint32_t kWindowFrameMagic = 0x31575354;  // "TSW1"
constexpr size_t kWindowHeaderBytes = 32;
constexpr size_t kSmallMessageBytes = 4096;  // header + payload sent in one write
// Most payload bytes moved per direction per peer in one progress pass, so sending
// and receiving interleave (both peers keep busy, data stays in cache).
constexpr size_t kBurstBytes = size_t{256} << 10;

size_t PadFor(uint64_t size) { return static_cast<size_t>((8 - size % 8) % 8); }

std::string Seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ns) * 1e-9);
  return buf;
}

int OpenPidfd(int pid) {
  if (pid <= 0) return -1;
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace

Messenger::Messenger(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
                     std::vector<PeerInfo> peers, ShmControl* self_control, WaitOptions options,
                     Store* failure_store)
    : rank_(rank),
      size_(size),
      channels_(std::move(channels)),
      peers_(std::move(peers)),
      state_(static_cast<size_t>(size)),
      self_control_(self_control),
      options_(options),
      failure_store_(failure_store),
      current_spin_ns_(options.spin_ns),
      abort_event_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  TESSERA_CHECK_EQ(channels_.size(), static_cast<size_t>(size));
  TESSERA_CHECK_EQ(peers_.size(), static_cast<size_t>(size));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (peers_[p].shm_control != nullptr && peers_[p].pid != static_cast<int>(::getpid())) {
      state_[p].pidfd.Reset(OpenPidfd(peers_[p].pid));
    }
    if (peers_[p].shm_control == nullptr) any_tcp_ = true;
  }
}

Messenger::~Messenger() = default;

std::string Messenger::DescribePeer(int peer) const {
  std::string text = "rank " + std::to_string(peer);
  if (peer < 0 || peer >= size_ || peer == rank_) return text;
  const PeerInfo& info = peers_[peer];
  if (info.shm_control != nullptr) {
    text += " (shm, pid " + std::to_string(info.pid) + ")";
  } else {
    text += " (" + info.address + ")";
  }
  return text;
}

Status Messenger::Begin(Primitive primitive, bool count_call) {
  if (!poison_.ok()) {
    return PoisonedError();
  }
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    return Poison(AbortedError("communicator aborted: " + abort_reason_));
  }
  primitive_ = primitive;
  if (count_call) ledger_.mutable_entry(primitive).calls++;
  op_start_ns_ = NowNs();
  deadline_ = options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  return Status::Ok();
}

void Messenger::PostSend(SendOp* op) {
  TESSERA_CHECK(op->peer >= 0 && op->peer < size_ && op->peer != rank_) << op->peer;
  op->done = false;
  op->progress = 0;
  op->primitive = primitive_;
  state_[op->peer].sends.push_back(op);
}

void Messenger::PostRecv(RecvOp* op) {
  TESSERA_CHECK(op->peer >= 0 && op->peer < size_ && op->peer != rank_) << op->peer;
  op->done = false;
  op->received = 0;
  op->primitive = primitive_;
  PeerState& ps = state_[op->peer];
  // An earlier message with this tag that arrived before its receive was posted.
  for (Unexpected& u : ps.unexpected) {
    if (u.tag == op->tag && u.waiting == nullptr) {
      u.waiting = op;
      return;
    }
  }
  ps.recvs.push_back(op);
}

void Messenger::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "Abort() called" : reason;
  }
  aborted_.store(true);
  if (self_control_ != nullptr) {
    self_control_->doorbell.fetch_add(1);
    FutexWake(&self_control_->doorbell);
  }
  uint64_t one = 1;
  if (abort_event_.valid()) (void)!::write(abort_event_.get(), &one, sizeof(one));
}

Status Messenger::PoisonedError() const {
  return Status(poison_.code(),
                "communicator unusable after an earlier error: " + poison_.message());
}

Status Messenger::Poison(Status status) {
  if (!poison_.ok()) return status;
  poison_ = status;
  std::string text = DescribePeer(rank_) + ": " + status.ToString();
  if (self_control_ != nullptr) {
    std::snprintf(self_control_->failure, sizeof(self_control_->failure), "%s", text.c_str());
    self_control_->failed.store(1, std::memory_order_release);
  }
  if (failure_store_ != nullptr) {
    (void)failure_store_->SetString("failed/" + std::to_string(rank_), text);
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (peers_[p].shm_control != nullptr) {
      peers_[p].shm_control->doorbell.fetch_add(1);
      FutexWake(&peers_[p].shm_control->doorbell);
    }
    channels_[p]->Shutdown();
  }
  TLOG_DEBUG("comm", "poisoned: %s", status.ToString().c_str());
  return status;
}

Status Messenger::PeerError(int peer, const Status& cause) {
  std::string text = DescribePeer(peer) + " " + cause.message() + " during " +
                     std::string(PrimitiveName(primitive_)) + " after " +
                     Seconds(NowNs() - op_start_ns_);
  // If the peer failed first, say why (it recorded the reason).
  std::string reason;
  if (peers_[peer].shm_control != nullptr &&
      peers_[peer].shm_control->failed.load(std::memory_order_acquire) != 0) {
    reason.assign(
        peers_[peer].shm_control->failure,
        strnlen(peers_[peer].shm_control->failure, sizeof(peers_[peer].shm_control->failure)));
  } else if (failure_store_ != nullptr) {
    auto stored =
        failure_store_->GetString("failed/" + std::to_string(peer), Deadline::AfterMs(200));
    if (stored.ok()) reason = *stored;
  }
  if (!reason.empty()) text += "; it had failed: " + reason;
  return Poison(Status(cause.code(), text));
}

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

bool Messenger::CompleteCopies(int peer, PeerState& ps) {
  bool progressed = false;
  while (!ps.copy_sends.empty() && peers_[peer].copy_acks_from->load(std::memory_order_acquire) >=
                                       ps.copy_sends.front()->copy_seq) {
    SendOp* op = ps.copy_sends.front();
    op->done = true;
    ledger_.mutable_entry(op->primitive).bytes_sent += op->bytes;
    ps.copy_sends.pop_front();
    progressed = true;
  }
  return progressed;
}

void Messenger::AddPeerWindow(int peer, uint64_t id, const uint8_t* base, size_t bytes) {
  state_[peer].windows.push_back(PeerState::Window{id, base, bytes});
}

Result<const uint8_t*> Messenger::PeerWindowBytes(const PeerState& ps, uint64_t id, uint64_t offset,
                                                  uint64_t size) const {
  for (const PeerState::Window& w : ps.windows) {
    if (w.id != id) continue;
    if (offset > w.bytes || size > w.bytes - offset) {
      return InvalidArgumentError("sent a descriptor for bytes [" + std::to_string(offset) + ", +" +
                                  std::to_string(size) + ") of its " + std::to_string(w.bytes) +
                                  "-byte shared buffer " + std::to_string(id));
    }
    return w.base + offset;
  }
  return InvalidArgumentError("sent a descriptor for shared buffer " + std::to_string(id) +
                              ", which it has not shared");
}

Status Messenger::ReadPeerMemory(int peer, void* dst, uint64_t addr, size_t size) {
  if (peers_[peer].pid == static_cast<int>(::getpid())) {  // ranks as threads
    std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), size);
    return Status::Ok();
  }
  uint8_t* out = static_cast<uint8_t*>(dst);
  while (size > 0) {
    iovec local{out, size};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), size};
    const ssize_t got = ::process_vm_readv(peers_[peer].pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return UnavailableError(std::string("could not be read (process_vm_readv: ") +
                              (got < 0 ? std::strerror(errno) : "no progress") + ")");
    }
    out += got;
    addr += static_cast<uint64_t>(got);
    size -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

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
        while (!ps.unexpected.empty() && ps.unexpected.front().complete &&
               ps.unexpected.front().waiting != nullptr) {
          Unexpected& u = ps.unexpected.front();
          if (u.size > u.waiting->capacity) {
            return InvalidArgumentError("sent a " + std::to_string(u.size) +
                                        "-byte message for a " +
                                        std::to_string(u.waiting->capacity) +
                                        "-byte receive (tag " + std::to_string(u.tag) + ")");
          }
          TESSERA_RETURN_IF_ERROR(Deliver(peer, u.waiting, u.data.data(), u.size));
          unexpected_bytes_ -= u.size;
          ps.unexpected.pop_front();
        }
        break;
      }
    }
  }
}

Result<bool> Messenger::ProgressPeer(int peer) {
  PeerState& ps = state_[peer];
  bool progressed = !ps.copy_sends.empty() && CompleteCopies(peer, ps);
  if (!ps.sends.empty()) {
    auto sent = ProgressSends(peer, ps);
    if (!sent.ok()) return PeerError(peer, sent.status());
    progressed |= *sent;
  }
  // Buffered messages whose receive was posted after they completed.
  while (!ps.unexpected.empty() && ps.unexpected.front().complete &&
         ps.unexpected.front().waiting != nullptr) {
    Unexpected& u = ps.unexpected.front();
    if (u.size > u.waiting->capacity ||
        (u.waiting->mode == RecvMode::kReduce && u.size != u.waiting->capacity)) {
      return PeerError(peer, InvalidArgumentError("sent a message larger than its receive"));
    }
    Status s = Deliver(peer, u.waiting, u.data.data(), u.size);
    if (!s.ok()) return PeerError(peer, s);
    unexpected_bytes_ -= u.size;
    ps.unexpected.pop_front();
    progressed = true;
  }
  auto received = ProgressRecvs(peer, ps);
  if (!received.ok()) return PeerError(peer, received.status());
  progressed |= *received;
  return progressed;
}

Status Messenger::CheckLiveness() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || peers_[p].shm_control == nullptr) continue;
    if (peers_[p].shm_control->failed.load(std::memory_order_acquire) != 0) {
      return PeerError(p, AbortedError("failed"));
    }
    if (state_[p].pidfd.valid()) {
      pollfd pfd{state_[p].pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) <= 0) continue;
      // The peer's process is gone. That is an error only if this operation still
      // needs it, and only once what it wrote before exiting has been drained (a
      // peer may send its last message and exit cleanly).
      PeerState& ps = state_[p];
      if (!ps.active() && !MailboxPending(p)) continue;
      Result<bool> progressed = ProgressPeer(p);
      if (!progressed.ok()) return progressed.status();
      if (*progressed) continue;
      return PeerError(p, UnavailableError("died"));
    }
  }
  return Status::Ok();
}

void Messenger::Sleep(int64_t max_us) {
  if (!any_tcp_ && self_control_ != nullptr) {
    uint32_t bell = self_control_->doorbell.load(std::memory_order_seq_cst);
    self_control_->sleeping.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // Re-check after announcing the sleep (writers check `sleeping` after writing).
    bool ready = aborted_.load();
    if (mailbox_waiting_ != 0) {  // a peer published before seeing that we sleep
      int arrived = 0;
      for (int p = 0; p < size_; ++p) arrived += p == rank_ || !MailboxPending(p) ? 1 : 0;
      ready |= arrived > mailbox_arrived_;
    }
    for (int p = 0; p < size_ && !ready; ++p) {
      if (p == rank_) continue;
      PeerState& ps = state_[p];
      if (!ps.active()) continue;
      if (!ps.copy_sends.empty() && peers_[p].copy_acks_from->load(std::memory_order_acquire) >=
                                        ps.copy_sends.front()->copy_seq) {
        ready = true;  // the peer read our buffer before seeing that we sleep
        break;
      }
      if (!ps.sends.empty() && channels_[p]->HasRoom()) {
        ready = true;  // the reader freed room before seeing that we sleep
        break;
      }
      auto span = channels_[p]->Peek();
      if (!span.ok() || !span->empty()) ready = true;
    }
    if (!ready) FutexWait(&self_control_->doorbell, bell, max_us);
    self_control_->sleeping.store(0, std::memory_order_relaxed);
    return;
  }
  std::vector<pollfd> fds;
  int64_t held_until_ns = 0;  // earliest end of an emulated link delay (TESSERA_TCP_DELAY_US)
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !state_[p].active()) continue;
    channels_[p]->AddPollFds(&fds, !state_[p].sends.empty());
    const int64_t held = channels_[p]->HeldUntilNs();
    if (held != 0 && (held_until_ns == 0 || held < held_until_ns)) held_until_ns = held;
  }
  if (abort_event_.valid()) fds.push_back(pollfd{abort_event_.get(), POLLIN, 0});
  // Shared-memory peers cannot wake poll(): with some, nap only briefly.
  int64_t timeout_us = self_control_ != nullptr ? std::min<int64_t>(max_us, 50) : max_us;
  if (held_until_ns != 0) {
    timeout_us = std::clamp<int64_t>((held_until_ns - NowNs() + 999) / 1000, 0, timeout_us);
    // The emulated delay ends on a timeout, which Linux may extend by the thread's
    // timer slack (50 µs by default): half of a 0.1 ms link. Wake on time instead.
    thread_local const bool precise_timers = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
    (void)precise_timers;
  }
  timespec ts{static_cast<time_t>(timeout_us / 1'000'000),
              static_cast<long>((timeout_us % 1'000'000) * 1000)};
  ::ppoll(fds.data(), fds.size(), &ts, nullptr);
}

std::string Messenger::PendingSummary(std::span<Op* const> ops) const {
  std::string text;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerState& ps = state_[p];
    bool send = !ps.sends.empty();
    bool recv = !ps.recvs.empty() || ps.in != PeerState::In::kHeader || MailboxPending(p);
    if (!send && !recv) continue;
    if (!text.empty()) text += ", ";
    text += DescribePeer(p);
    text += send && recv ? " (send+recv)" : send ? " (send)" : " (recv)";
  }
  return text.empty() ? "nothing" : text;
}

void Messenger::CopyLocal(void* dst, const void* src, size_t bytes, size_t whole) const {
  if (BypassesCache(std::max(bytes, whole))) {
    CopyBypassingCache(dst, src, bytes);
  } else if (bytes > 0) {
    std::memcpy(dst, src, bytes);
  }
}

Status Messenger::Progress() {
  if (!poison_.ok()) return PoisonedError();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !state_[p].active()) continue;
    Result<bool> progressed = ProgressPeer(p);
    if (!progressed.ok()) return Poison(progressed.status());
  }
  return Status::Ok();
}

Result<bool> Messenger::Test(std::span<Op* const> ops) {
  TESSERA_RETURN_IF_ERROR(Progress());
  for (Op* op : ops) {
    if (!op->done) return false;
  }
  return true;
}

Status Messenger::WaitAll(std::span<Op* const> ops) {
  if (!poison_.ok()) {
    return PoisonedError();
  }
  return WaitLoop(
      [&]() -> Result<PollResult> {
        PollResult result;
        for (int p = 0; p < size_; ++p) {
          if (p == rank_ || !state_[p].active()) continue;
          TESSERA_ASSIGN_OR_RETURN(bool progressed, ProgressPeer(p));
          result.progressed |= progressed;
        }
        result.done = std::all_of(ops.begin(), ops.end(), [](const Op* op) { return op->done; });
        return result;
      },
      ops);
}

template <typename Poll>
Status Messenger::WaitLoop(Poll&& poll, std::span<Op* const> ops) {
  int64_t last_progress_ns = 0;  // read from the clock once the first spins are over
  uint32_t spins = 0;
  bool slept = false;
  bool spun = false;
  bool work_left = static_cast<bool>(wait_work_);
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(PollResult polled, poll());
    if (polled.done) {
      constexpr int64_t kMinSpinNs = 2'000;
      if (!options_.yield_while_spinning) {
        // A core of our own: spinning starves nobody, and a sleep puts a wake-up
        // (tens of µs) on the critical path of whoever we wait for. Keep the full budget.
      } else if (slept) {
        current_spin_ns_ = std::max(current_spin_ns_ / 2, std::min(kMinSpinNs, options_.spin_ns));
      } else if (spun) {
        current_spin_ns_ = std::min(current_spin_ns_ * 2 + kMinSpinNs, options_.spin_ns);
      }
      return Status::Ok();
    }
    if (aborted_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      return Poison(AbortedError("communicator aborted during " +
                                 std::string(PrimitiveName(primitive_)) + ": " + abort_reason_));
    }
    if (polled.progressed) {
      last_progress_ns = 0;
      spins = 0;
      continue;
    }
    if (work_left) {  // the caller's useful work, a step between polls, before any spin
      work_left = wait_work_();
      continue;
    }
    spun = true;
    if ((++spins & 63) != 0 && !options_.yield_while_spinning) {
      _mm_pause();
      continue;
    }
    int64_t now = NowNs();
    if (last_progress_ns == 0) last_progress_ns = now;
    if (now - last_progress_ns < current_spin_ns_) {
      if (options_.yield_while_spinning) ::sched_yield();
      continue;
    }
    if (deadline_.Expired()) {
      return Poison(DeadlineExceededError(
          std::string(PrimitiveName(primitive_)) + " did not complete within " +
          std::to_string(options_.timeout_ms) + " ms; still waiting on " + PendingSummary(ops)));
    }
    if (now - last_liveness_ns_ >= options_.liveness_check_ms * 1'000'000) {
      last_liveness_ns_ = now;
      TESSERA_RETURN_IF_ERROR(CheckLiveness());
    }
    int64_t max_us = options_.liveness_check_ms * 1000;
    if (!deadline_.never()) {
      auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline_.when() - Clock::now())
              .count();
      max_us = std::clamp<int64_t>(left, 1, max_us);
    }
    slept = true;
    Sleep(max_us);
  }
}

// ---------------------------------------------------------------- mailbox

void Messenger::EnableMailbox(size_t bytes) {
  for (int p = 0; p < size_; ++p) {
    TESSERA_CHECK(peers_[p].mailbox[0] != nullptr && peers_[p].mailbox[1] != nullptr)
        << "rank " << p << " has no mailbox";
  }
  mailbox_bytes_ = bytes;
}

uint8_t* Messenger::MailboxSlot() {
  TESSERA_CHECK_GT(mailbox_bytes_, 0u);
  return peers_[rank_].mailbox[(mailbox_seq_ + 1) & 1]->data();
}

bool Messenger::MailboxPending(int peer) const {
  return mailbox_waiting_ != 0 && peers_[peer].mailbox[mailbox_waiting_ & 1]->seq.load(
                                      std::memory_order_acquire) < mailbox_waiting_;
}

Status Messenger::MailboxExchange(size_t bytes, std::span<const void*> slots) {
  TESSERA_CHECK(bytes <= mailbox_bytes_ && slots.size() == static_cast<size_t>(size_));
  if (!poison_.ok()) {
    return PoisonedError();
  }
  const uint64_t seq = ++mailbox_seq_;
  const int index = static_cast<int>(seq & 1);
  peers_[rank_].mailbox[index]->seq.store(seq, std::memory_order_release);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) WakeIfSleeping(peers_[p].shm_control);
  }
  LedgerEntry& entry = ledger_.mutable_entry(primitive_);
  entry.bytes_sent += bytes * static_cast<size_t>(size_ - 1);
  entry.bytes_received += bytes * static_cast<size_t>(size_ - 1);
  mailbox_waiting_ = seq;
  mailbox_arrived_ = 1;
  // A published slot stays published until we publish the next exchange, so the
  // count only grows.
  Status status = WaitLoop(
      [&]() -> Result<PollResult> {
        int arrived = 1;
        for (int p = 0; p < size_; ++p) arrived += p != rank_ && !MailboxPending(p) ? 1 : 0;
        PollResult result{.done = arrived == size_, .progressed = arrived > mailbox_arrived_};
        mailbox_arrived_ = arrived;
        return result;
      },
      {});
  mailbox_waiting_ = 0;
  TESSERA_RETURN_IF_ERROR(status);
  for (int p = 0; p < size_; ++p) slots[p] = peers_[p].mailbox[index]->data();
  return Status::Ok();
}

}  // namespace tessera::comm
