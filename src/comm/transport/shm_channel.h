// ShmChannel: the byte stream between two ranks on one host, as two SPSC rings
// (one in each rank's ShmSegment). The writer copies chunks straight into the
// reader's ring; the reader reduces or copies straight out of it. Each chunk
// starts with a 16-byte header whose stamp (written last, release) marks it
// complete, so a small message costs one cache-line transfer. Layer: comm. Not
// thread-safe: one communicator thread drives it.
#pragma once

#include <cstdint>

#include "comm/transport/channel.h"
#include "comm/transport/shm_segment.h"

namespace tessera::comm {

class ShmChannel : public Channel {
 public:
  // `self`/`peer` are the two ranks' segments (borrowed; they outlive the
  // channel). We read ring `peer_rank` of `self` and write ring `self_rank` of
  // `peer`. `chunk_bytes` caps one chunk (a multiple of 16).
  ShmChannel(const ShmSegment& self, int self_rank, const ShmSegment& peer, int peer_rank,
             size_t chunk_bytes);

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override;
  void NotifyPeer() override;
  bool HasRoom() const override;
  std::string Describe() const override { return "shm"; }

  ShmControl* peer_control() const { return peer_control_; }

 private:
  void PublishHead();

  // Outbound ring (in the peer's segment).
  uint8_t* out_data_;
  ShmRingHead* out_head_;
  uint64_t out_tail_ = 0;         // bytes written (private to the writer)
  uint64_t out_head_cached_ = 0;  // last seen reader position
  // Inbound ring (in our segment).
  uint8_t* in_data_;
  ShmRingHead* in_head_shared_;
  uint64_t in_head_ = 0;  // start of the current chunk
  uint32_t cur_len_ = 0;  // payload bytes in the current chunk (0 = none open)
  uint32_t cur_off_ = 0;  // bytes of it consumed
  size_t ring_bytes_;
  size_t chunk_bytes_;
  ShmControl* self_control_;
  ShmControl* peer_control_;
  uint64_t out_salt_;
  uint64_t in_salt_;
  bool wrote_ = false;
};

}  // namespace tessera::comm
