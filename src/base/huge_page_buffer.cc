#include "base/huge_page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "base/check.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TESSERA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define TESSERA_ASAN 1
#endif
#endif

namespace tessera {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Under AddressSanitizer the mapping reaches at least one byte past the buffer and
// everything after `bytes` is poisoned: a write past the end (a buffer sized for
// the wrong layout) is reported there instead of landing silently in the rest of
// the last page. mmap'd memory is otherwise invisible to ASan.
#ifdef TESSERA_ASAN
constexpr size_t kGuardBytes = 1;
void PoisonTail(uint8_t* data, size_t bytes, size_t mapped) {
  ASAN_POISON_MEMORY_REGION(data + bytes, mapped - bytes);
}
void Unpoison(uint8_t* data, size_t mapped) { ASAN_UNPOISON_MEMORY_REGION(data, mapped); }
#else
constexpr size_t kGuardBytes = 0;
void PoisonTail(uint8_t*, size_t, size_t) {}
void Unpoison(uint8_t*, size_t) {}
#endif

}  // namespace

Result<HugePageBuffer> HugePageBuffer::Map(size_t bytes) {
  HugePageBuffer buffer;
  if (bytes == 0) return buffer;
  // Below a huge page, plain pages; above, map one huge page more than needed and
  // trim both ends to a 2 MiB-aligned range. Fresh anonymous pages read as zero.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const bool huge = bytes >= kHugePage;
  const size_t mapped = RoundUp(bytes + kGuardBytes, huge ? kHugePage : page);
  const size_t reserve = huge ? mapped + kHugePage : mapped;
  void* base = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return ResourceExhaustedError("cannot map " + std::to_string(reserve) +
                                  " bytes of memory: " + std::strerror(errno));
  }
  auto* start = static_cast<uint8_t*>(base);
  if (huge) {
    auto* aligned =
        reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(start), kHugePage));
    if (aligned > start) ::munmap(start, static_cast<size_t>(aligned - start));
    const size_t tail = static_cast<size_t>(start + reserve - (aligned + mapped));
    if (tail > 0) ::munmap(aligned + mapped, tail);
    start = aligned;
    // Advice only: without THP (or with it off) these stay ordinary pages. The huge
    // pages end where the last whole one within `bytes` does; the partly used one
    // after it stays on 4 KiB pages, so that only the pages touched there count (a
    // huge page is resident whole: the 110M Q8_0 model's repacked weights left 1.1
    // MiB of one unused).
    const size_t whole = bytes / kHugePage * kHugePage;
    ::madvise(start, whole, MADV_HUGEPAGE);
    if (whole < mapped) ::madvise(start + whole, mapped - whole, MADV_NOHUGEPAGE);
  }
  PoisonTail(start, bytes, mapped);
  buffer.data_ = start;
  buffer.size_ = bytes;
  buffer.mapped_ = mapped;
  return buffer;
}

HugePageBuffer::HugePageBuffer(size_t bytes) {
  Result<HugePageBuffer> mapped = Map(bytes);
  TESSERA_CHECK(mapped.ok()) << mapped.status().ToString();
  *this = std::move(*mapped);
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) {
    Unpoison(data_, mapped_);  // the addresses may be mapped again
    ::munmap(data_, mapped_);
  }
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) {
      Unpoison(data_, mapped_);
      ::munmap(data_, mapped_);
    }
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

Result<std::span<uint8_t>> HugePageArena::Allocate(size_t bytes) {
  bytes = RoundedBytes(bytes);
  if (bytes > chunk_bytes_) {
    TESSERA_ASSIGN_OR_RETURN(HugePageBuffer own, HugePageBuffer::Map(bytes));
    HugePageBuffer& kept = buffers_.emplace_back(std::move(own));
    return std::span<uint8_t>(kept.data(), bytes);
  }
  if (chunk_ == SIZE_MAX || chunk_used_ + bytes > buffers_[chunk_].size()) {
    // Each new chunk twice the last (up to kMaxChunkBytes): a chunk's unused tail
    // costs nothing until touched, but the huge page its last range ends in is
    // resident whole, so fewer chunks leave fewer such pages (a 1.1B Q4_K_M model:
    // 20 chunks of 32 MiB, ~20 MiB of partly used huge pages).
    const size_t size =
        chunk_ == SIZE_MAX
            ? chunk_bytes_
            : std::max(chunk_bytes_, std::min(2 * buffers_[chunk_].size(), kMaxChunkBytes));
    TESSERA_ASSIGN_OR_RETURN(HugePageBuffer chunk, HugePageBuffer::Map(size));
    buffers_.push_back(std::move(chunk));
    chunk_ = buffers_.size() - 1;
    chunk_used_ = 0;
  }
  std::span<uint8_t> range(buffers_[chunk_].data() + chunk_used_, bytes);
  chunk_used_ += bytes;
  return range;
}

}  // namespace tessera
