// ThreadPool: the compute pool that runs kernels (matmul rows, attention heads) on a
// fixed set of threads. Layer: base; owned by the engine (one per rank), passed down
// to kernels by pointer, never a singleton.
// ParallelFor partitions statically: thread i gets the same contiguous range for the
// same (n, grain, num_threads). ParallelForBalanced starts from the same ranges, then
// lets a thread that finished take pieces from the end of another's: for work whose
// results never depend on which thread runs a piece (a matmul's rows), so results
// are deterministic either way. Workers spin briefly after each job
// (decode issues many short jobs back to back) and then sleep on a futex.
// Thread-safety: Run/ParallelFor/ParallelForBalanced must be called from one thread
// at a time (the owner); a call made from inside a running job executes inline on
// the caller.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

namespace tessera {

struct ThreadPoolOptions {
  int num_threads = 0;  // including the calling thread; 0 = hardware concurrency
  int spin_us = 50;     // how long an idle worker polls before sleeping
};

class ThreadPool {
 public:
  explicit ThreadPool(ThreadPoolOptions options = {});
  explicit ThreadPool(int num_threads) : ThreadPool(ThreadPoolOptions{num_threads}) {}
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that run a job, the calling thread included (>= 1).
  int num_threads() const { return num_threads_; }

  // Calls fn(thread_idx) once for each thread_idx in [0, num_threads()); the caller
  // runs index 0. Returns when every call has returned. fn must not throw.
  template <class Fn>
  void Run(Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    RunJob(
        +[](void* ctx, int idx) { (*static_cast<F*>(ctx))(idx); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Splits [0, n) into num_threads() contiguous ranges whose bounds are multiples of
  // `grain` (except the end n) and calls fn(begin, end) for each non-empty one.
  template <class Fn>
  void ParallelFor(int64_t n, Fn&& fn, int64_t grain = 1) {
    if (n <= 0) return;
    const int64_t blocks = (n + grain - 1) / grain;
    const int workers = static_cast<int>(std::min<int64_t>(blocks, num_threads_));
    if (workers <= 1 || InJob()) {
      fn(int64_t{0}, n);
      return;
    }
    Run([&](int idx) {
      const int64_t b0 = blocks * idx / num_threads_;
      const int64_t b1 = blocks * (idx + 1) / num_threads_;
      const int64_t begin = b0 * grain;
      const int64_t end = std::min(n, b1 * grain);
      if (begin < end) fn(begin, end);
    });
  }

  // As ParallelFor, but each thread walks its range in pieces of `piece` (a multiple
  // of grain), and one that runs out takes pieces from the back of the others'
  // ranges: a thread slowed for a moment (a VM's stolen time, a core in a slower
  // state) no longer holds up the rest at the end of a short job. fn(begin, end) is
  // called once per piece; every index in [0, n) is in exactly one piece, and piece
  // bounds are multiples of grain (except the end n), but which thread runs a piece
  // varies from call to call.
  template <class Fn>
  void ParallelForBalanced(int64_t n, Fn&& fn, int64_t grain, int64_t piece) {
    if (n <= 0) return;
    const int64_t blocks = (n + grain - 1) / grain;
    const int64_t piece_blocks = std::max<int64_t>(1, piece / grain);
    if (blocks >= (int64_t{1} << 32)) return ParallelFor(n, std::forward<Fn>(fn), grain);
    if (std::min<int64_t>(blocks, num_threads_) <= 1 || InJob()) {
      fn(int64_t{0}, n);
      return;
    }
    for (int i = 0; i < num_threads_; ++i) {
      ranges_[i].blocks.store(PackRange(blocks * i / num_threads_, blocks * (i + 1) / num_threads_),
                              std::memory_order_relaxed);
    }
    Run([&](int idx) {
      int64_t first = 0, last = 0;
      for (int victim = idx, tries = 0; tries < num_threads_;) {
        const bool own = victim == idx;
        if (!TakePiece(ranges_[victim].blocks, piece_blocks, /*front=*/own, &first, &last)) {
          victim = (victim + 1) % num_threads_;
          ++tries;
          continue;
        }
        fn(first * grain, std::min(n, last * grain));
      }
    });
  }

  // The range ParallelFor(n, ·, grain) gives thread idx (for callers that size
  // per-thread scratch).
  static void PartitionRange(int64_t n, int64_t grain, int num_threads, int idx, int64_t* begin,
                             int64_t* end);

 private:
  // A thread's remaining blocks [front, back) of a ParallelForBalanced, packed in one
  // word so that its owner (from the front) and thieves (from the back) claim
  // pieces with one compare-and-swap; one cache line each.
  struct alignas(64) BlockRange {
    std::atomic<uint64_t> blocks{0};
  };
  static uint64_t PackRange(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  }
  // Claims up to `piece` blocks from the front or the back of `range` into [first,
  // last); false once it is empty.
  static bool TakePiece(std::atomic<uint64_t>& range, int64_t piece, bool front, int64_t* first,
                        int64_t* last);

  using JobFn = void (*)(void*, int);
  void RunJob(JobFn fn, void* ctx);
  void WorkerLoop(int idx);
  bool InJob() const;

  int num_threads_;
  int spin_us_;
  std::vector<std::thread> workers_;
  // Job slot, published by bumping generation_.
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> owner_sleeping_{false};
  std::atomic<bool> in_job_{false};
  std::atomic<bool> stop_{false};
  std::unique_ptr<BlockRange[]> ranges_;  // num_threads_ of them (ParallelForBalanced)
};

}  // namespace tessera
