#include "base/huge_page_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

}  // namespace
}  // namespace tessera
