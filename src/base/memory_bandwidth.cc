#include "base/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/clock.h"
#include "base/huge_page_buffer.h"
#include "base/target_clones.h"

namespace tessera {
namespace {

// 64 bytes as eight 64-bit lanes: one cache line per load where the target has
// 512-bit vectors (two or four loads on narrower ones).
typedef uint64_t Line __attribute__((vector_size(64), aligned(64)));

// Sums the buffer's lines in kStreams contiguous parts read side by side, each
// with its own accumulator and a prefetch a few lines ahead: several sequential
// streams per core, as the matmul kernels read weights, and whole-line vector loads,
// as they do, so that the probe reads at the rate the core can stream memory, not
// at the rate of its instruction mix. On the Zen 5 VM (a test loop over 256 MiB of
// huge pages, one core, best of 3, three alternating rounds), 64-bit scalar loads in
// 8 streams read 14.6 GB/s, 512-bit loads 30–31, with the prefetch 32–33. The
// earlier probe here (64-bit words, 4 KiB pages) read 23–25 GB/s in `bench model`
// while the 1.1B Q8_0 decode read 26: "102–116% of the roofline"; this one read
// 31–39 in the same state. Compiled for AVX-512, AVX2 and the baseline; the loader
// picks the best the CPU runs.
TESSERA_TARGET_CLONES("avx512f", "avx2", "default")
uint64_t SumLines(const Line* lines, size_t num_lines) {
  constexpr size_t kStreams = 8, kAhead = 4;
  const size_t part = num_lines / kStreams;
  Line acc[kStreams] = {};
  for (size_t i = 0; i < part; ++i) {
    for (size_t s = 0; s < kStreams; ++s) {
      if (i + kAhead < part) __builtin_prefetch(&lines[s * part + i + kAhead]);
      acc[s] += lines[s * part + i];
    }
  }
  for (size_t i = kStreams * part; i < num_lines; ++i) acc[0] += lines[i];
  uint64_t sum = 0;
  for (const Line& a : acc) {
    for (int lane = 0; lane < 8; ++lane) sum += a[lane];
  }
  return sum;
}

// A thread's buffers, on transparent huge pages where the kernel gives them (as the
// engine's repacked weights are): a probe on 4 KiB pages would also measure TLB
// misses the engine does not take.
struct ThreadBuffers {
  HugePageBuffer src;
  HugePageBuffer dst;
};

}  // namespace

MemoryBandwidth MeasureMemoryBandwidth(const MemoryBandwidthOptions& options) {
  TESSERA_CHECK_GE(options.num_threads, 1);
  TESSERA_CHECK_GE(options.repetitions, 1);
  const size_t num_lines = std::max<size_t>(options.buffer_bytes / sizeof(Line), 1024);
  const size_t bytes = num_lines * sizeof(Line);
  const int num_threads = options.num_threads;

  std::vector<ThreadBuffers> buffers(num_threads);
  std::atomic<uint64_t> sink{0};
  // Two phases per repetition (copy, read); each phase starts on a barrier and
  // its time is the slowest thread's.
  std::barrier sync(num_threads + 1);
  std::vector<int64_t> copy_ns(options.repetitions, 0), read_ns(options.repetitions, 0);

  auto worker = [&](int t) {
    ThreadBuffers& buf = buffers[t];
    buf.src = HugePageBuffer(bytes);
    buf.dst = HugePageBuffer(bytes);
    auto* words = reinterpret_cast<uint64_t*>(buf.src.data());
    for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) words[i] = i * 0x9e3779b97f4a7c15ull;
    std::memset(buf.dst.data(), 0, bytes);  // maps the pages before the first timing
    uint64_t local = 0;
    sync.arrive_and_wait();  // buffers ready
    for (int r = 0; r < options.repetitions; ++r) {
      sync.arrive_and_wait();
      std::memcpy(buf.dst.data(), buf.src.data(), bytes);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      local += SumLines(reinterpret_cast<const Line*>(buf.dst.data()), num_lines);
      sync.arrive_and_wait();
    }
    sink.fetch_add(local, std::memory_order_relaxed);
  };

  std::vector<std::thread> threads;
  threads.reserve(num_threads);
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(worker, t);
  sync.arrive_and_wait();
  for (int r = 0; r < options.repetitions; ++r) {
    int64_t start = NowNs();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    copy_ns[r] = NowNs() - start;
    start = NowNs();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    read_ns[r] = NowNs() - start;
  }
  for (auto& thread : threads) thread.join();

  const double total_bytes = static_cast<double>(bytes) * num_threads;
  MemoryBandwidth result;
  result.num_threads = num_threads;
  int64_t best_copy = *std::min_element(copy_ns.begin(), copy_ns.end());
  int64_t best_read = *std::min_element(read_ns.begin(), read_ns.end());
  result.copy_bytes_per_s = total_bytes / (std::max<int64_t>(best_copy, 1) * 1e-9);
  result.read_bytes_per_s = total_bytes / (std::max<int64_t>(best_read, 1) * 1e-9);
  if (sink.load() == 42) result.read_bytes_per_s += 0;  // keeps the sums observable
  return result;
}

}  // namespace tessera
