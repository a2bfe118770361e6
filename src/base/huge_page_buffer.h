// HugePageBuffer: a large, zero-initialised, read-mostly buffer (repacked weights)
// in anonymous memory aligned to 2 MiB and advised for transparent huge pages, so
// that streaming it takes one TLB entry per 2 MiB instead of one per 4 KiB page
// (a decode step reads every weight once). Where the kernel gives no huge pages it
// is plain memory. Layer: base. Move-only; the bytes never move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tessera {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Aborts when the memory cannot be mapped (as operator new would throw).
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

}  // namespace tessera
