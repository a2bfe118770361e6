#include "base/huge_page_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tessera {
namespace {

bool AllZero(const HugePageBuffer& b) {
  return std::all_of(b.data(), b.data() + b.size(), [](uint8_t v) { return v == 0; });
}

TEST(HugePageBufferTest, SmallAndLargeBuffersAreZeroedWritableAndSized) {
  for (size_t bytes : {size_t{1}, size_t{4095}, size_t{3} << 20, (size_t{5} << 20) + 17}) {
    SCOPED_TRACE(bytes);
    HugePageBuffer b(bytes);
    ASSERT_EQ(b.size(), bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_TRUE(AllZero(b));
    b.data()[0] = 1;
    b.data()[bytes - 1] = 2;
    EXPECT_EQ(b.data()[bytes - 1], 2);
    const std::span<const uint8_t> view = b;
    EXPECT_EQ(view.size(), bytes);
  }
}

TEST(HugePageBufferTest, LargeBuffersStartOnAHugePageBoundary) {
  HugePageBuffer b(size_t{6} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u);
}

// The huge pages end with the last whole one inside the buffer: touching every byte
// of 2 MiB + 8 KiB leaves the rest of the mapping's last 2 MiB (mapped, never
// handed out) unresident, where a huge page there would be resident whole.
TEST(HugePageBufferTest, ThePartlyUsedLastHugePageStaysOnSmallPages) {
  constexpr size_t kHuge = size_t{2} << 20, kBytes = kHuge + 8192;
  HugePageBuffer b(kBytes);
  std::fill(b.data(), b.data() + kBytes, uint8_t{1});
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = kBytes + (size_t{64} << 10);  // past any fault-around of the tail
  std::vector<unsigned char> resident((2 * kHuge - begin) / page);
  ASSERT_EQ(::mincore(b.data() + begin, 2 * kHuge - begin, resident.data()), 0);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }),
            0);
}

TEST(HugePageBufferTest, MovingKeepsTheBytesWhereTheyAre) {
  HugePageBuffer a(size_t{3} << 20);
  a.data()[123] = 7;
  const uint8_t* where = a.data();
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(b.data()[123], 7);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  HugePageBuffer c(16);
  c = std::move(b);
  EXPECT_EQ(c.data(), where);
  EXPECT_EQ(c.size(), size_t{3} << 20);
  HugePageBuffer empty(0);
  EXPECT_EQ(empty.size(), 0u);
}

// Under AddressSanitizer a write just past the end is reported, also where the size
// is a whole number of pages or huge pages (mmap'd memory is otherwise unchecked):
// the way `plan --calibrate`'s Q4_K buffer, sized for the GGUF rows instead of the
// interleaved ones, was found.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

TEST(HugePageBufferDeathTest, AddressSanitizerReportsAWritePastTheEnd) {
  if (!kAsan) GTEST_SKIP() << "not built with AddressSanitizer";
  for (size_t bytes : {size_t{4096}, size_t{2} << 20, (size_t{3} << 20) + 5}) {
    SCOPED_TRACE(bytes);
    HugePageBuffer b(bytes);
    b.data()[bytes - 1] = 1;  // the last byte is the buffer's
    volatile uint8_t* past = b.data() + bytes;
    EXPECT_DEATH(*past = 1, "AddressSanitizer: use-after-poison");
  }
}

// Small ranges are carved one after another from shared huge-page chunks (so many
// small matrices share 2 MiB pages); a range above the chunk size gets its own
// buffer. Every range is 64-byte aligned, zero, writable, disjoint from the others
// and stays put when the arena moves.
TEST(HugePageArenaTest, SmallRangesShareChunksLargeOnesStandAlone) {
  const size_t chunk = size_t{4} << 20;
  HugePageArena arena(chunk);
  std::vector<std::span<uint8_t>> ranges;
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{1} << 20, (size_t{2} << 20) - 200,
                       size_t{5} << 20, size_t{4096}, size_t{3} << 20}) {
    SCOPED_TRACE(bytes);
    Result<std::span<uint8_t>> allocated = arena.Allocate(bytes);
    ASSERT_TRUE(allocated.ok()) << allocated.status().ToString();
    const std::span<uint8_t> r = *allocated;
    ASSERT_GE(r.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data()) % 64, 0u);
    EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](uint8_t v) { return v == 0; }));
    std::fill(r.begin(), r.end(), static_cast<uint8_t>(ranges.size() + 1));
    ranges.push_back(r);
  }
  // The first four fit one chunk, back to back (each rounded up to 64 bytes).
  EXPECT_EQ(ranges[1].data(), ranges[0].data() + 64);
  EXPECT_EQ(ranges[2].data(), ranges[1].data() + 128);
  EXPECT_EQ(ranges[3].data(), ranges[2].data() + (size_t{1} << 20));
  // 5 MiB is larger than a chunk: a buffer of its own, on a huge-page boundary;
  // the next small range continues the open chunk.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ranges[4].data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(ranges[5].data(), ranges[3].data() + ranges[3].size());
  // 3 MiB does not fit what is left of the chunk: a new chunk.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ranges[6].data()) % (size_t{2} << 20), 0u);
  HugePageArena moved(std::move(arena));
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_TRUE(std::all_of(ranges[i].begin(), ranges[i].end(),
                            [&](uint8_t v) { return v == static_cast<uint8_t>(i + 1); }))
        << "range " << i << " was overwritten";
  }
}

// Each new chunk is twice the last: after a 4 MiB chunk, an 8 MiB one holds two
// 3 MiB ranges back to back, then a 16 MiB one four.
TEST(HugePageArenaTest, EachNewChunkDoublesTheLast) {
  const size_t chunk = size_t{4} << 20, bytes = size_t{3} << 20;
  HugePageArena arena(chunk);
  std::vector<uint8_t*> starts;
  for (int i = 0; i < 7; ++i) {
    Result<std::span<uint8_t>> r = arena.Allocate(bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    starts.push_back(r->data());
  }
  EXPECT_EQ(starts[2], starts[1] + bytes);  // the second chunk (8 MiB)
  EXPECT_NE(starts[3], starts[2] + bytes);  // full: a third
  for (int i = 4; i < 7; ++i) EXPECT_EQ(starts[i], starts[i - 1] + bytes) << i;  // 16 MiB
}

}  // namespace
// A mapping the kernel refuses (more address space than x86-64 has) is an error
// naming the size, not an abort, and the arena goes on serving what fits.
TEST(HugePageArenaTest, AMappingTheKernelRefusesIsAnErrorAndTheArenaGoesOn) {
  constexpr size_t kImpossible = size_t{1} << 60;
  Result<HugePageBuffer> buffer = HugePageBuffer::Map(kImpossible);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(buffer.status().message().find("cannot map"), std::string::npos)
      << buffer.status().ToString();

  HugePageArena arena(size_t{4} << 20);
  Result<std::span<uint8_t>> big = arena.Allocate(kImpossible);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  Result<std::span<uint8_t>> small = arena.Allocate(1000);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_GE(small->size(), 1000u);
  (*small)[999] = 7;
}

}  // namespace tessera
