// CopyBypassingCache against memcpy: every head alignment, tails of every length,
// and the bytes around the destination untouched.
#include "comm/copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tessera::comm {
namespace {

TEST(CopyBypassingCacheTest, MatchesMemcpyAtEveryAlignmentAndLength) {
  std::vector<uint8_t> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t dst_offset : {0, 1, 7, 8, 15, 16, 33}) {
    for (size_t src_offset : {0, 3, 16}) {
      for (size_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4096 + 61}) {
        std::vector<uint8_t> dst(bytes + 64, 0xee);
        CopyBypassingCache(dst.data() + dst_offset, src.data() + src_offset, bytes);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_offset && i < dst_offset + bytes;
          const uint8_t want = inside ? src[src_offset + i - dst_offset] : 0xee;
          ASSERT_EQ(dst[i], want) << "dst+" << dst_offset << " src+" << src_offset << " " << bytes
                                  << " bytes, byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::comm
