#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
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

TEST(ThreadPoolTest, ParallelForBalancedCoversRangeOnceInAlignedPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001, 4096}) {
      for (int64_t grain : {1, 4, 16}) {
        for (int64_t piece : {grain, 4 * grain, 64 * grain}) {
          std::vector<std::atomic<int>> count(static_cast<size_t>(n));
          pool.ParallelForBalanced(
              n,
              [&](int64_t begin, int64_t end) {
                EXPECT_LT(begin, end);
                EXPECT_EQ(begin % grain, 0);
                EXPECT_TRUE(end == n || end % grain == 0) << end;
                if (threads > 1 && n > grain) {
                  EXPECT_LE(end - begin, std::max(piece, grain));
                }
                for (int64_t i = begin; i < end; ++i) count[i].fetch_add(1);
              },
              grain, piece);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(count[i].load(), 1) << threads << " " << n << " " << grain << " " << i;
          }
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ParallelForBalancedLetsAFreeThreadTakeASlowOnesPieces) {
  // The calling thread (index 0, the first half of the range) is slow on every
  // piece: the worker finishes its half and then takes pieces from the end of the
  // first half.
  ThreadPool pool(2);
  const int64_t n = 64;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> first_half_by_worker{0};
  pool.ParallelForBalanced(
      n,
      [&](int64_t begin, int64_t end) {
        if (std::this_thread::get_id() == caller) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } else if (begin < n / 2) {
          first_half_by_worker.fetch_add(end - begin);
        }
      },
      1, 4);
  EXPECT_GT(first_half_by_worker.load(), 0);
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
