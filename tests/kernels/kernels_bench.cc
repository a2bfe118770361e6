// Micro-benchmarks of the kernels at TinyLlama shapes: GEMV (n_tokens = 1) reports
// GB/s of weights read next to the machine's measured read bandwidth; GEMM
// (n_tokens = 512) reports GFLOP/s. Weight matrices are replicated until the set is
// far larger than the last-level cache and cycled through, so GEMV reads DRAM as it
// does in a real model.
//   kernels_bench [--benchmark_filter=Gemv] [--benchmark_min_time=0.5]
// TESSERA_BENCH_HOT=1 times one cache-resident copy instead (the arithmetic alone).
// TESSERA_BENCH_TARGET=AVX2 (a Highway target name: AVX3_DL, AVX3, AVX2, SSE4, …)
// runs the kernels compiled for that target, so one machine can time the code
// older CPUs get; the name of the one that ran is in the context.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/memory_bandwidth.h"
#include "base/thread_pool.h"
#include "hwy/targets.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"

namespace tessera::kernels {
namespace {

constexpr WeightType kTypes[] = {WeightType::kF16,  WeightType::kQ8_0, WeightType::kQ4_0,
                                 WeightType::kQ4_K, WeightType::kF32,  WeightType::kQ6_K};
constexpr int64_t kShapes[][2] = {{2048, 2048},
                                  {5632, 2048},
                                  {2048, 5632},
                                  {32000, 2048},
                                  // the ~110M model's (dim 768, ffn 2048)
                                  {768, 768},
                                  {2048, 768},
                                  {768, 2048}};

// TESSERA_BENCH_HOT=1: one copy of the weights or cache, cache-resident when it
// fits, to time the arithmetic without the memory stream.
bool HotCache() { return std::getenv("TESSERA_BENCH_HOT") != nullptr; }

// Copies of one random matrix, at least min_total_bytes together.
struct WeightSet {
  WeightType type;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  std::vector<uint8_t> bytes;
  int copies = 0;
  WeightView View(int i) const {
    return {type, bytes.data() + static_cast<size_t>(i % copies) * rows * row_bytes, rows, cols,
            row_bytes};
  }
};

const WeightSet& GetWeights(WeightType type, int64_t rows, int64_t cols) {
  static std::unique_ptr<WeightSet> cached;  // one at a time: the sets are large
  if (cached && cached->type == type && cached->rows == rows && cached->cols == cols) {
    return *cached;
  }
  cached.reset();
  auto set = std::make_unique<WeightSet>();
  set->type = type;
  set->rows = rows;
  set->cols = cols;
  set->row_bytes = *RowBytes(type, cols);
  const size_t matrix_bytes = rows * set->row_bytes;
  set->copies =
      HotCache() ? 1 : static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / matrix_bytes));
  set->bytes.resize(matrix_bytes * set->copies);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  // 64 distinct random rows, repeated: values do not change the speed.
  const int64_t distinct = std::min<int64_t>(64, rows);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < distinct; ++r) {
    for (float& v : src) v = dist(rng);
    uint8_t* dst = set->bytes.data() + r * set->row_bytes;
    if (CanQuantize(type)) {
      QuantizeRow(type, src.data(), cols, dst);
    } else {  // K-quants: random bytes, small f16 scales
      for (int64_t i = 0; i < set->row_bytes; ++i) dst[i] = static_cast<uint8_t>(rng());
      for (int64_t b = 0; b < set->row_bytes; b += 144) {
        dst[b + 1] = 0x20;
        dst[b + 3] = 0x20;
      }
    }
  }
  for (int64_t r = distinct; r < rows * set->copies; ++r) {
    std::memcpy(set->bytes.data() + r * set->row_bytes,
                set->bytes.data() + (r % distinct) * set->row_bytes, set->row_bytes);
  }
  cached = std::move(set);
  return *cached;
}

// Times MatMul over `views` (cycled: copies of one matrix, so decode-sized calls
// stream from memory) and reports GB/s (one token) and GFLOP/s.
void TimeMatMul(benchmark::State& state, const std::vector<WeightView>& views, int64_t n_tokens,
                int threads, std::string_view label) {
  const int64_t rows = views[0].rows, cols = views[0].cols;
  ThreadPool pool(threads);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist;
  std::vector<float> x(n_tokens * cols), y(n_tokens * rows);
  for (float& v : x) v = dist(rng);
  size_t i = 0;
  for (auto _ : state) {
    MatMul(views[i++ % views.size()], x.data(), n_tokens, y.data(), {}, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(label));
  // Weight bytes read per second: the decode roofline's measure for micro-batches too.
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(rows * views[0].row_bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * n_tokens * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MatMul(benchmark::State& state) {
  const WeightType type = kTypes[state.range(0)];
  const WeightSet& w = GetWeights(type, state.range(1), state.range(2));
  std::vector<WeightView> views;
  for (int c = 0; c < w.copies; ++c) views.push_back(w.View(c));
  TimeMatMul(state, views, state.range(3), static_cast<int>(state.range(4)), TraitsOf(type).name);
}

void MatMulArgs(benchmark::internal::Benchmark* b) {
  for (int t : {0, 1, 2, 3, 5}) {
    for (const auto& shape : kShapes) {
      for (int64_t n_tokens : {1, 4, 64, 512}) {
        for (int threads : {1, 2}) b->Args({t, shape[0], shape[1], n_tokens, threads});
      }
    }
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads"})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_MatMul)->Apply(MatMulArgs);

// Weights interleaved 8 rows to a group (kInterleaved8, the engine's layout after
// load), same shapes: compare with BM_MatMul of the same type (the GGUF rows; float
// types pack their rows on the fly there).
void BM_MatMulInterleaved8(benchmark::State& state) {
  const WeightType type = kTypes[state.range(0)];
  const int64_t rows = state.range(1), cols = state.range(2);
  const WeightSet& w = GetWeights(type, rows, cols);
  const int64_t packed_row_bytes = Interleaved8RowBytes(type, cols);
  // On huge pages, as the engine's repacked weights are.
  static HugePageBuffer packed;
  const auto bytes = static_cast<size_t>(w.copies * rows * packed_row_bytes);
  if (packed.size() < bytes) packed = HugePageBuffer(bytes);
  std::vector<WeightView> views;
  for (int c = 0; c < w.copies; ++c) {
    views.push_back(Interleave8(w.View(c), packed.data() + c * rows * packed_row_bytes));
  }
  TimeMatMul(state, views, state.range(3), static_cast<int>(state.range(4)),
             std::string(TraitsOf(type).name) + "x8");
}
BENCHMARK(BM_MatMulInterleaved8)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int t : {0, 1, 2, 3, 4, 5}) {
        for (const auto& shape : kShapes) {
          // 4 and 8: a pipeline stage's micro-batches and a small decode batch;
          // 128 and 256: either side of the F16/BF16 prefill widening threshold.
          for (int64_t n_tokens : {1, 4, 8, 64, 128, 256, 512}) {
            for (int threads : {1, 2}) b->Args({t, shape[0], shape[1], n_tokens, threads});
          }
        }
      }
      b->ArgNames({"type", "rows", "cols", "tokens", "threads"});
    })
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Decode attention of one sequence at context `len`, head_dim 64, f16 KV, block 16:
// heads 32 over 4 KV heads (TinyLlama, grouped) or 12 over 12 (the ~110M, one head a
// group). Like the GEMV benchmarks, the iterations cycle through copies of the
// cache (256 MiB together, on huge pages as kv::KvCache's) so that K/V come from
// memory, as a model's layers do; TESSERA_BENCH_HOT=1 keeps one copy.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t len = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t heads = state.range(2);
  KvLayout layout{16, heads == 32 ? 4 : heads, 64, KvType::kF16};
  const int64_t n_blocks = len / 16 + 1;
  const int64_t pool_bytes = n_blocks * layout.BlockBytes();
  const int64_t copies =
      HotCache() ? 1 : std::max<int64_t>(1, (int64_t{256} << 20) / (2 * pool_bytes));
  HugePageBuffer k(static_cast<size_t>(copies * pool_bytes)), v(k.size());
  std::mt19937 rng(3);  // one random copy, repeated (values do not change the speed)
  for (int64_t i = 0; i < pool_bytes; ++i) {
    k.data()[i] = static_cast<uint8_t>(rng() & 0x3b);
    v.data()[i] = static_cast<uint8_t>(rng() & 0x3b);
  }
  for (int64_t c = 1; c < copies; ++c) {
    std::memcpy(k.data() + c * pool_bytes, k.data(), pool_bytes);
    std::memcpy(v.data() + c * pool_bytes, v.data(), pool_bytes);
  }
  std::vector<int32_t> table(n_blocks);
  for (int64_t i = 0; i < n_blocks; ++i) table[i] = static_cast<int32_t>(n_blocks - 1 - i);
  std::vector<PagedKv> caches;
  for (int64_t c = 0; c < copies; ++c) {
    caches.push_back({layout, k.data() + c * pool_bytes, v.data() + c * pool_bytes, n_blocks});
  }
  std::vector<float> q(heads * 64, 0.1f), out(heads * 64);
  ThreadPool pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    Attention(caches[i++ % caches.size()], table, q.data(), heads, len - 1, out.data(), &pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * len * layout.TokenElems() * 2 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{128, 512, 2048}, {1, 2}, {32, 12}})
    ->ArgNames({"ctx", "threads", "heads"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Cost of one ParallelFor over 2 threads with (almost) no work: the per-call overhead
// decode pays for every matmul.
void BM_ParallelForOverhead(benchmark::State& state) {
  ThreadPool pool(2);
  std::vector<int64_t> sink(2 * 64);
  for (auto _ : state) {
    pool.ParallelFor(2, [&](int64_t begin, int64_t end) { sink[begin * 64] += end; });
  }
  benchmark::DoNotOptimize(sink.data());
}
BENCHMARK(BM_ParallelForOverhead)->UseRealTime();

void BM_RmsNorm(benchmark::State& state) {
  std::vector<float> x(2048, 0.5f), w(2048, 1.0f), y(2048);
  for (auto _ : state) {
    RmsNorm(x, w, 1e-5f, y);
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_RmsNorm);

}  // namespace
}  // namespace tessera::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const char* wanted = std::getenv("TESSERA_BENCH_TARGET"); wanted != nullptr) {
    bool found = false;
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      if (std::strcmp(hwy::TargetName(target), wanted) != 0) continue;
      hwy::SetSupportedTargetsForTest(target);
      found = true;
    }
    if (!found) {
      std::fprintf(stderr,
                   "TESSERA_BENCH_TARGET=%s: not a target this CPU runs and this build has\n",
                   wanted);
      return 2;
    }
  }
  // Highway's dispatch takes the best target it has, the lowest bit.
  int64_t best = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (best == 0 || target < best) best = target;
  }
  benchmark::AddCustomContext("simd_target", hwy::TargetName(best));
  for (int threads : {1, 2}) {
    tessera::MemoryBandwidthOptions options;
    options.num_threads = threads;
    options.buffer_bytes = size_t{128} << 20;
    const tessera::MemoryBandwidth bw = tessera::MeasureMemoryBandwidth(options);
    benchmark::AddCustomContext("read_GB/s_" + std::to_string(threads) + "t",
                                std::to_string(bw.read_bytes_per_s * 1e-9));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
