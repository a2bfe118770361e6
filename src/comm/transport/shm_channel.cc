#include "comm/transport/shm_channel.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/populate.h"

namespace tessera::comm {
namespace {

constexpr uint32_t kHeaderBytes = 16;
constexpr uint32_t kWrapMarker = 0xffffffffu;

inline size_t Round16(size_t n) { return (n + 15) & ~size_t{15}; }
// Chunks start on cache lines: a small message (header + up to 48 bytes) is one line.
inline size_t ChunkStride(size_t payload) { return (kHeaderBytes + payload + 63) & ~size_t{63}; }
// Distinct for every ring position (an odd multiplier is a bijection), keyed by
// the ring owner's salt.
inline uint64_t StampFor(uint64_t position, uint64_t salt) {
  return ((position / 16 + 1) * 0x9e3779b97f4a7c15ull) ^ salt;
}

inline std::atomic_ref<uint64_t> StampRef(uint8_t* chunk) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(chunk));
}

}  // namespace

ShmChannel::ShmChannel(const ShmSegment& self, int self_rank, const ShmSegment& peer, int peer_rank,
                       size_t chunk_bytes)
    : out_data_(peer.ring_data(self_rank)),
      out_head_(peer.ring_head(self_rank)),
      in_data_(self.ring_data(peer_rank)),
      in_head_shared_(self.ring_head(peer_rank)),
      ring_bytes_(self.ring_bytes()),
      chunk_bytes_(std::min(Round16(std::max<size_t>(chunk_bytes, 16)), self.ring_bytes() / 2)),
      self_control_(self.control()),
      peer_control_(peer.control()),
      out_salt_(peer.control()->ring_salt),
      in_salt_(self.control()->ring_salt) {
  // Both rings mapped now, not at first touch: left to fault in, a new
  // communicator's first MiBs of traffic ran 10–20x slow (1024 faults a 4 MiB ring
  // side, ~16 ms in all for two ranks); one madvise each maps them for a tenth of
  // that, at connect.
  PopulateForWrite(in_data_, ring_bytes_);
  PopulateForWrite(out_data_, ring_bytes_);
}

Result<size_t> ShmChannel::Write(const void* data, size_t size) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  size_t written = 0;
  while (written < size) {
    const size_t pos = out_tail_ % ring_bytes_;
    const size_t to_end = ring_bytes_ - pos;
    size_t free_bytes = ring_bytes_ - (out_tail_ - out_head_cached_);
    size_t n = std::min(size - written, chunk_bytes_);
    if (ChunkStride(n) > to_end) {
      if (to_end >= 128) {
        n = std::min(n, (to_end - kHeaderBytes) & ~size_t{63});
      } else {  // no room for a chunk before the end: mark a wrap
        if (free_bytes < to_end) {
          out_head_cached_ = out_head_->head.load(std::memory_order_acquire);
          free_bytes = ring_bytes_ - (out_tail_ - out_head_cached_);
          if (free_bytes < to_end) break;
        }
        uint8_t* chunk = out_data_ + pos;
        std::memcpy(chunk + 8, &kWrapMarker, 4);
        StampRef(chunk).store(StampFor(out_tail_, out_salt_), std::memory_order_release);
        out_tail_ += to_end;
        continue;
      }
    }
    if (ChunkStride(n) > free_bytes) {
      out_head_cached_ = out_head_->head.load(std::memory_order_acquire);
      free_bytes = ring_bytes_ - (out_tail_ - out_head_cached_);
      if (ChunkStride(n) > free_bytes) {
        if (free_bytes < 1024) break;  // wait for a useful amount
        n = std::min(n, (free_bytes - kHeaderBytes) & ~size_t{63});
      }
    }
    uint8_t* chunk = out_data_ + pos;
    std::memcpy(chunk + kHeaderBytes, src + written, n);
    uint32_t len = static_cast<uint32_t>(n);
    std::memcpy(chunk + 8, &len, 4);
    StampRef(chunk).store(StampFor(out_tail_, out_salt_), std::memory_order_release);
    out_tail_ += ChunkStride(n);
    written += n;
  }
  if (written > 0) wrote_ = true;
  return written;
}

bool ShmChannel::HasRoom() const {
  uint64_t head = out_head_->head.load(std::memory_order_acquire);
  return ring_bytes_ - (out_tail_ - head) >= 1024;
}

void ShmChannel::NotifyPeer() {
  if (!wrote_) return;
  wrote_ = false;
  WakeIfSleeping(peer_control_);
}

Result<std::span<const uint8_t>> ShmChannel::Peek() {
  while (true) {
    const size_t pos = in_head_ % ring_bytes_;
    uint8_t* chunk = in_data_ + pos;
    if (cur_len_ != 0) {
      return std::span<const uint8_t>(chunk + kHeaderBytes + cur_off_, cur_len_ - cur_off_);
    }
    if (StampRef(chunk).load(std::memory_order_acquire) != StampFor(in_head_, in_salt_)) {
      return std::span<const uint8_t>();
    }
    uint32_t len = 0;
    std::memcpy(&len, chunk + 8, 4);
    if (len == kWrapMarker) {
      in_head_ += ring_bytes_ - pos;
      PublishHead();
      continue;
    }
    if (len == 0 || ChunkStride(len) > ring_bytes_ - pos) {
      return InvalidArgumentError("corrupt shared-memory chunk (length " + std::to_string(len) +
                                  " at ring offset " + std::to_string(pos) + ")");
    }
    cur_len_ = len;
    cur_off_ = 0;
  }
}

void ShmChannel::Consume(size_t size) {
  cur_off_ += static_cast<uint32_t>(size);
  if (cur_off_ >= cur_len_ && cur_len_ != 0) {
    in_head_ += ChunkStride(cur_len_);
    cur_len_ = 0;
    cur_off_ = 0;
    PublishHead();
  }
}

void ShmChannel::PublishHead() {
  in_head_shared_->head.store(in_head_, std::memory_order_release);
  // The writer may sleep waiting for room.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (peer_control_->sleeping.load(std::memory_order_relaxed) != 0) {
    peer_control_->doorbell.fetch_add(1, std::memory_order_seq_cst);
    FutexWake(&peer_control_->doorbell);
  }
}

}  // namespace tessera::comm
