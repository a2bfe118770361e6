#include "base/thread_pool.h"

#include <chrono>

#include "base/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` for about spin_us microseconds; true if it became true.
template <class Pred>
bool SpinUntil(Pred done, int spin_us) {
  if (done()) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      CpuRelax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace

ThreadPool::ThreadPool(ThreadPoolOptions options) : spin_us_(options.spin_us) {
  num_threads_ = options.num_threads > 0 ? options.num_threads
                                         : static_cast<int>(std::thread::hardware_concurrency());
  if (num_threads_ < 1) num_threads_ = 1;
  ranges_ = std::make_unique<BlockRange[]>(static_cast<size_t>(num_threads_));
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::InJob() const { return in_job_.load(std::memory_order_relaxed); }

void ThreadPool::PartitionRange(int64_t n, int64_t grain, int num_threads, int idx, int64_t* begin,
                                int64_t* end) {
  const int64_t blocks = (n + grain - 1) / grain;
  *begin = std::min(n, blocks * idx / num_threads * grain);
  *end = std::min(n, blocks * (idx + 1) / num_threads * grain);
}

bool ThreadPool::TakePiece(std::atomic<uint64_t>& range, int64_t piece, bool front, int64_t* first,
                           int64_t* last) {
  uint64_t packed = range.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t f = static_cast<int64_t>(packed >> 32);
    const int64_t b = static_cast<int64_t>(packed & 0xffffffffu);
    if (f >= b) return false;
    const int64_t take = std::min(piece, b - f);
    const uint64_t rest = front ? PackRange(f + take, b) : PackRange(f, b - take);
    if (range.compare_exchange_weak(packed, rest, std::memory_order_relaxed)) {
      *first = front ? f : b - take;
      *last = front ? f + take : b;
      return true;
    }
  }
}

void ThreadPool::RunJob(JobFn fn, void* ctx) {
  if (num_threads_ == 1 || InJob()) {
    for (int i = 0; i < num_threads_; ++i) fn(ctx, i);
    return;
  }
  in_job_.store(true, std::memory_order_relaxed);
  job_fn_ = fn;
  job_ctx_ = ctx;
  pending_.store(num_threads_ - 1);
  // seq_cst pairs with the worker's sleeping_workers_ increment (Dekker): either we
  // see the sleeper and wake it, or it sees the new generation before it sleeps.
  generation_.fetch_add(1);
  if (sleeping_workers_.load() > 0) generation_.notify_all();

  fn(ctx, 0);

  if (!SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; }, spin_us_)) {
    owner_sleeping_.store(true);
    for (int left = pending_.load(); left != 0; left = pending_.load()) pending_.wait(left);
    owner_sleeping_.store(false);
  }
  in_job_.store(false, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int idx) {
  uint32_t seen = 0;  // the generation at construction; a job may start before we run
  for (;;) {
    if (!SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; }, spin_us_)) {
      sleeping_workers_.fetch_add(1);
      while (generation_.load() == seen) generation_.wait(seen);
      sleeping_workers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    job_fn_(job_ctx_, idx);
    if (pending_.fetch_sub(1) == 1 && owner_sleeping_.load()) pending_.notify_one();
  }
}

}  // namespace tessera
