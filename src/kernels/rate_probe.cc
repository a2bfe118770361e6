#include "kernels/rate_probe.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"

namespace tessera::kernels {
namespace {

// Seconds per call of `run`, timed for `seconds` (at least 2 calls) after one
// untimed call (the warm-up: first touches, the pool's threads waking).
template <class Run>
double SecondsPerCall(double seconds, Run&& run) {
  using Clock = std::chrono::steady_clock;
  run();
  int64_t calls = 0;
  const auto start = Clock::now();
  double took = 0;
  while (took < seconds || calls < 2) {
    run();
    ++calls;
    took = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return took / static_cast<double>(calls);
}

// Zero weights of `type`, `rows` × `cols` (kRows, GGUF blocks).
std::vector<uint8_t> ZeroRows(WeightType type, int64_t rows, int64_t cols) {
  const std::optional<int64_t> row_bytes = RowBytes(type, cols);
  TESSERA_CHECK(row_bytes.has_value()) << TraitsOf(type).name << " cols " << cols;
  return std::vector<uint8_t>(static_cast<size_t>(rows * *row_bytes), 0);
}

}  // namespace

WeightView EngineLayout(const WeightView& view, HugePageBuffer* packed) {
  if (!CanInterleave8(view)) return view;
  *packed =
      HugePageBuffer(static_cast<size_t>(view.rows * Interleaved8RowBytes(view.type, view.cols)));
  return Interleave8(view, packed->data());
}

WeightStreamProbe::WeightStreamProbe(WeightType type, const RateProbeOptions& options)
    : type_(type),
      seconds_(options.seconds),
      matrix_rows_(options.matrix_rows),
      matrix_cols_(options.matrix_cols) {
  TESSERA_CHECK(matrix_rows_ > 0 && matrix_rows_ % 8 == 0) << matrix_rows_;
  TESSERA_CHECK(matrix_cols_ > 0 && matrix_cols_ % 256 == 0) << matrix_cols_;
  const std::vector<uint8_t> source = ZeroRows(type, matrix_rows_, matrix_cols_);
  gguf_row_bytes_ = *RowBytes(type, matrix_cols_);
  const WeightView one{type, source.data(), matrix_rows_, matrix_cols_, gguf_row_bytes_};
  const bool interleave = CanInterleave8(one);
  read_row_bytes_ = interleave ? Interleaved8RowBytes(type, matrix_cols_) : gguf_row_bytes_;
  num_matrices_ = std::max<int64_t>(1, options.stream_bytes / (matrix_rows_ * gguf_row_bytes_));
  const int64_t matrix_bytes = matrix_rows_ * read_row_bytes_;
  weights_ = HugePageBuffer(static_cast<size_t>(num_matrices_ * matrix_bytes));
  // Every matrix laid out as the loader lays it out: one source matrix, packed (or
  // copied) into each slot, so the probe holds one matrix besides its stream.
  for (int64_t m = 0; m < num_matrices_; ++m) {
    uint8_t* slot = weights_.data() + m * matrix_bytes;
    if (interleave) {
      Interleave8(one, slot);
    } else {
      std::copy(source.begin(), source.end(), slot);
    }
  }
  view_ = {type,
           weights_.data(),
           num_matrices_ * matrix_rows_,
           matrix_cols_,
           read_row_bytes_,
           interleave ? WeightLayout::kInterleaved8 : WeightLayout::kRows};
}

double WeightStreamProbe::SecondsPerPass(int64_t tokens, ThreadPool* pool) const {
  TESSERA_CHECK_GE(tokens, 1);
  const std::vector<float> x(static_cast<size_t>(tokens * matrix_cols_), 0.5f);
  std::vector<float> y(static_cast<size_t>(tokens * matrix_rows_));
  return SecondsPerCall(seconds_, [&] {
    for (int64_t r = 0; r < view_.rows; r += matrix_rows_) {
      MatMul(RowShard(view_, r, r + matrix_rows_), x.data(), tokens, y.data(), {}, pool);
    }
  });
}

double MeasureGemmFlops(WeightType type, const RateProbeOptions& options, ThreadPool* pool) {
  const int64_t dim = options.gemm_dim, tokens = options.gemm_tokens;
  const std::vector<uint8_t> w = ZeroRows(type, dim, dim);
  HugePageBuffer packed;
  const WeightView view = EngineLayout({type, w.data(), dim, dim, *RowBytes(type, dim)}, &packed);
  const std::vector<float> x(static_cast<size_t>(tokens * dim), 0.5f);
  std::vector<float> y(static_cast<size_t>(tokens * dim));
  const double seconds =
      SecondsPerCall(options.seconds, [&] { MatMul(view, x.data(), tokens, y.data(), {}, pool); });
  return 2.0 * static_cast<double>(tokens * dim * dim) / seconds;
}

namespace {

// Figures compared with one another are timed in kSweepRounds rounds of
// options.seconds / kSweepRounds, taking turns, and keep their medians.
constexpr int kSweepRounds = 3;

// The sweep's probes: one per row length of options.sweep_cols, then the short
// matrices.
std::vector<WeightStreamProbe> SweepProbes(WeightType type, const RateProbeOptions& options) {
  std::vector<WeightStreamProbe> probes;
  probes.reserve(options.sweep_cols.size() + 1);
  RateProbeOptions shape = options;
  shape.seconds = options.seconds / kSweepRounds;
  for (int64_t cols : options.sweep_cols) {
    shape.matrix_cols = cols;
    probes.emplace_back(type, shape);
  }
  shape.matrix_rows = options.short_rows;
  shape.matrix_cols = options.matrix_cols;
  probes.emplace_back(type, shape);
  return probes;
}

ColumnSweep SweepRates(const std::vector<WeightStreamProbe>& probes,
                       const RateProbeOptions& options, ThreadPool* pool) {
  std::vector<std::vector<double>> seconds(probes.size());  // per pass, each round
  for (int round = 0; round < kSweepRounds; ++round) {
    for (size_t i = 0; i < probes.size(); ++i) {
      seconds[i].push_back(probes[i].SecondsPerPass(1, pool));
    }
  }
  const auto median = [&](size_t i) {
    std::sort(seconds[i].begin(), seconds[i].end());
    return seconds[i][kSweepRounds / 2];
  };
  ColumnSweep sweep;
  for (size_t i = 0; i + 1 < probes.size(); ++i) {
    sweep.bytes_per_s[options.sweep_cols[i]] =
        static_cast<double>(probes[i].gguf_bytes()) / median(i);
  }
  // t = c + bytes / r for one call of each shape: the full matrices (b bytes, t_big)
  // and the short ones (b_short, t_short) give c = (t_short·b − t_big·b_short) / (b − b_short).
  const auto it =
      std::find(options.sweep_cols.begin(), options.sweep_cols.end(), options.matrix_cols);
  if (it != options.sweep_cols.end()) {
    const size_t big = static_cast<size_t>(it - options.sweep_cols.begin());
    const size_t small = probes.size() - 1;
    const auto per_call = [&](size_t i) {
      return median(i) / static_cast<double>(probes[i].num_matrices());
    };
    const auto bytes = [&](size_t i) {
      return static_cast<double>(probes[i].gguf_bytes()) /
             static_cast<double>(probes[i].num_matrices());
    };
    const double b = bytes(big), b_short = bytes(small);
    if (b > b_short) {
      sweep.call_seconds =
          std::max(0.0, (per_call(small) * b - per_call(big) * b_short) / (b - b_short));
    }
  }
  return sweep;
}

}  // namespace

ColumnSweep MeasureColumnSweep(WeightType type, const RateProbeOptions& options, ThreadPool* pool) {
  return SweepRates(SweepProbes(type, options), options, pool);
}

KernelRates MeasureKernelRates(WeightType type, ThreadPool& all_cores,
                               const RateProbeOptions& options) {
  KernelRates rates;
  {
    // The six figures take turns in rounds too (medians): the machine's speed drifts
    // between figures measured one after another, and the planner compares them
    // (one thread against all cores, one row against four).
    RateProbeOptions round = options;
    round.seconds = options.seconds / kSweepRounds;
    const WeightStreamProbe probe(type, round);
    struct Figure {
      int64_t tokens;
      ThreadPool* pool;
      double* bytes_per_s;
      std::vector<double> seconds;
    };
    std::vector<Figure> figures = {{1, nullptr, &rates.gemv_bytes_per_s, {}},
                                   {1, &all_cores, &rates.gemv_all_bytes_per_s, {}}};
    for (int64_t rows : {4, 16}) {
      figures.push_back({rows, nullptr, &rates.rows_bytes_per_s[rows], {}});
      figures.push_back({rows, &all_cores, &rates.rows_all_bytes_per_s[rows], {}});
    }
    for (int r = 0; r < kSweepRounds; ++r) {
      for (Figure& f : figures) f.seconds.push_back(probe.SecondsPerPass(f.tokens, f.pool));
    }
    for (Figure& f : figures) {
      std::sort(f.seconds.begin(), f.seconds.end());
      *f.bytes_per_s = static_cast<double>(probe.gguf_bytes()) / f.seconds[kSweepRounds / 2];
    }
  }
  {
    const std::vector<WeightStreamProbe> probes = SweepProbes(type, options);
    ColumnSweep one = SweepRates(probes, options, nullptr);
    ColumnSweep all = SweepRates(probes, options, &all_cores);
    rates.cols_bytes_per_s = std::move(one.bytes_per_s);
    rates.call_seconds = one.call_seconds;
    rates.cols_all_bytes_per_s = std::move(all.bytes_per_s);
    rates.call_all_seconds = all.call_seconds;
  }
  rates.gemm_flops = MeasureGemmFlops(type, options, nullptr);
  return rates;
}

}  // namespace tessera::kernels
