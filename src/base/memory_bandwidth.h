// MemoryBandwidth: a small probe of the machine's memory copy and read bandwidth
// with 1 and N threads, so benchmarks can print the hardware limit next to what
// they measured. Layer: base; used by `tessera bench comm` and the model benchmark.
// Thread-safe (each call owns its buffers and threads).
#pragma once

#include <cstddef>

namespace tessera {

struct MemoryBandwidthOptions {
  size_t buffer_bytes = size_t{256} << 20;  // per thread; far larger than the caches
  int num_threads = 1;
  int repetitions = 3;  // the best repetition is reported
};

struct MemoryBandwidth {
  int num_threads = 0;
  // Bytes copied per second (memcpy of buffer_bytes; counts the bytes copied once,
  // like `memcpy bandwidth` in most tools, not read + write).
  double copy_bytes_per_s = 0;
  // Bytes read per second (a summing pass over the buffer, in 8 streams of
  // whole-line vector loads; the buffers are on huge pages where the kernel gives them).
  double read_bytes_per_s = 0;
};

// Measures with `options.num_threads` threads each working on its own buffers
// (aggregate figures). Takes about repetitions × (2 passes) × buffer / bandwidth.
MemoryBandwidth MeasureMemoryBandwidth(const MemoryBandwidthOptions& options);

}  // namespace tessera
