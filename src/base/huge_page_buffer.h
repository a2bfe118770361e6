// HugePageBuffer: a large, zero-initialised buffer (repacked weights, the KV cache)
// in anonymous memory aligned to 2 MiB and advised for transparent huge pages, so
// that streaming it takes one TLB entry per 2 MiB instead of one per 4 KiB page
// (a decode step reads every weight once, and every head's rows of its context).
// Pages are committed as they are first touched. Where the kernel gives no huge pages it
// is plain memory. Layer: base. Move-only; the bytes never move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace tessera {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // `bytes` of fresh memory; ResourceExhausted, naming the size and the kernel's
  // reason, when it refuses the mapping (an address-space limit, no overcommit).
  static Result<HugePageBuffer> Map(size_t bytes);
  // As Map, but aborts when the memory cannot be mapped (as operator new would
  // throw): for small buffers a process cannot do without.
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  operator std::span<const uint8_t>() const { return {data_, size_}; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped at data_ (size_ rounded up to whole pages)
};

// HugePageArena: byte ranges carved from HugePageBuffers (chunks of chunk_bytes,
// each new one twice the last, up to kMaxChunkBytes), so that matrices smaller than
// a huge page share 2 MiB pages instead of each taking its own plain 4 KiB ones (the
// 110M model's per-layer matrices are 0.6–1.7 MiB: on their own, 84 of them were left
// on 4 KiB pages). A range larger than chunk_bytes gets a buffer of its own. A caller
// that knows its total (RoundedBytes of each range) passes it as chunk_bytes: one
// chunk, and one partly used huge page at its end. Ranges are 64-byte aligned, zero,
// and never move; they live as long as the arena. Move-only, not thread-safe.
class HugePageArena {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t{32} << 20;  // the first chunk
  static constexpr size_t kMaxChunkBytes = size_t{1} << 30;
  static constexpr size_t kAlign = 64;
  explicit HugePageArena(size_t chunk_bytes = kDefaultChunkBytes) : chunk_bytes_(chunk_bytes) {}

  // ResourceExhausted when a new buffer cannot be mapped (the arena stays usable).
  Result<std::span<uint8_t>> Allocate(size_t bytes);
  // The arena bytes an Allocate(bytes) takes (rounded up to the alignment): ranges
  // adding up to a chunk_bytes given at construction all fit in the first chunk.
  static size_t RoundedBytes(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  size_t chunk_bytes_;
  std::vector<HugePageBuffer> buffers_;
  size_t chunk_ = SIZE_MAX;  // index in buffers_ of the shared chunk being carved
  size_t chunk_used_ = 0;
};

}  // namespace tessera
