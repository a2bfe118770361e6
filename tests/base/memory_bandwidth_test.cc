#include "base/memory_bandwidth.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(MemoryBandwidthTest, ReportsPositiveFiguresForOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    MemoryBandwidthOptions options;
    options.buffer_bytes = size_t{8} << 20;
    options.num_threads = threads;
    options.repetitions = 2;
    MemoryBandwidth bw = MeasureMemoryBandwidth(options);
    EXPECT_EQ(bw.num_threads, threads);
    // Any machine copies and reads more than 10 MB/s; a broken timer or byte count
    // (zero, negative, infinite) fails here.
    EXPECT_GT(bw.copy_bytes_per_s, 1e7);
    EXPECT_GT(bw.read_bytes_per_s, 1e7);
    EXPECT_LT(bw.copy_bytes_per_s, 1e13);
    EXPECT_LT(bw.read_bytes_per_s, 1e13);
  }
}

}  // namespace
}  // namespace tessera
