#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace tessera {
namespace {

TEST(ThreadPoolTest, RunCallsEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    std::vector<std::atomic<int>> hits(threads);
    for (int rep = 0; rep < 100; ++rep) pool.Run([&](int idx) { hits[idx].fetch_add(1); });
    for (int i = 0; i < threads; ++i) EXPECT_EQ(hits[i].load(), 100) << threads << " " << i;
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeOnceWithGrain) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
    for (int64_t grain : {1, 4, 16}) {
      std::vector<int> count(n, 0);
      pool.ParallelFor(
          n,
          [&](int64_t begin, int64_t end) {
            EXPECT_LT(begin, end);
            EXPECT_EQ(begin % grain, 0);
            for (int64_t i = begin; i < end; ++i) ++count[i];
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(count[i], 1) << n << " " << grain << " " << i;
    }
  }
}

TEST(ThreadPoolTest, PartitionIsStatic) {
  // Thread idx gets the range PartitionRange reports, every time.
  ThreadPool pool(4);
  const int64_t n = 103, grain = 8;
  std::vector<int64_t> begins(4, -1);
  for (int rep = 0; rep < 20; ++rep) {
    pool.Run([&](int idx) {
      int64_t b, e;
      ThreadPool::PartitionRange(n, grain, 4, idx, &b, &e);
      begins[idx] = b;
    });
  }
  int64_t expected_begin = 0;
  for (int idx = 0; idx < 4; ++idx) {
    int64_t b, e;
    ThreadPool::PartitionRange(n, grain, 4, idx, &b, &e);
    EXPECT_EQ(b, expected_begin);
    EXPECT_EQ(begins[idx], b);
    expected_begin = e;
  }
  EXPECT_EQ(expected_begin, n);
}

TEST(ThreadPoolTest, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(4, [&](int64_t begin, int64_t end) {
    pool.ParallelFor(10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  });
  EXPECT_EQ(total.load(), 20);
}

TEST(ThreadPoolTest, WorkersWakeAfterSleeping) {
  ThreadPoolOptions options;
  options.num_threads = 2;
  options.spin_us = 0;  // every wait goes to the futex
  ThreadPool pool(options);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.ParallelFor(100, [&](int64_t begin, int64_t end) {
      int64_t s = 0;
      for (int64_t i = begin; i < end; ++i) s += i;
      sum.fetch_add(s);
    });
  }
  EXPECT_EQ(sum.load(), 2000 * 4950);
}

}  // namespace
}  // namespace tessera
