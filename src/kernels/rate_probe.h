// Rate probe: what the matmul kernels themselves sustain on this machine for one
// weight type — weight bytes per second of a GEMV (and of a few token rows)
// streaming matrices past the caches in the layout the engine multiplies by, and a
// GEMM's FLOP/s. Layer: kernels; called by `tessera plan --calibrate` (the planner's
// cluster file) and `tessera bench model` (its decode roofline), so that both mean
// the same by "what this machine streams". Not thread-safe; the pools it is given
// must not be running other jobs.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "base/huge_page_buffer.h"
#include "kernels/matmul.h"
#include "kernels/weight_type.h"

namespace tessera {
class ThreadPool;
}

namespace tessera::kernels {

struct RateProbeOptions {
  // The streamed matrices: as many matrix_rows × matrix_cols matrices as fill
  // stream_bytes (at least one), one MatMul call each, so that what a call costs
  // besides its bytes counts as it does in a decode step. 128 MiB is far past the
  // last-level cache; 2048 × 2048 is a model's size (one 4096-column matrix read
  // 10–30% faster than a model's matrices did on the Zen 5 VM). Both dimensions
  // must be multiples of 256 (a K-quant super-block) and matrix_rows of 8.
  int64_t stream_bytes = int64_t{128} << 20;
  int64_t matrix_rows = 2048;
  int64_t matrix_cols = 2048;
  // The GEMM: gemm_tokens tokens through one gemm_dim × gemm_dim matrix (cached).
  int64_t gemm_dim = 1024;
  int64_t gemm_tokens = 64;
  // Seconds each figure is timed for, after one untimed pass (and at least 2 passes).
  double seconds = 0.25;
  // Row lengths of the one-row GEMV's column sweep (matrix_rows × c matrices, each
  // stream_bytes; matrix_cols among them): short rows stream slower (a group's
  // stream of a 768-column Q8_0 row is 6.5 KiB, too short for the prefetchers to
  // ramp up), and a model's matrices are not all 2048 wide.
  std::vector<int64_t> sweep_cols = {512, 1024, 2048, 4096};
  // Rows of the sweep's short matrices (short_rows × matrix_cols, timed with the
  // sweep): against the matrix_rows × matrix_cols ones they give a call's fixed cost
  // (ColumnSweep::call_seconds).
  int64_t short_rows = 256;
};

// `view` (kRows) in the layout the model loader gives it (model/llama_weights.cc):
// interleaved into `packed` (view.rows × Interleaved8RowBytes bytes, on huge pages as
// the loader's are) when CanInterleave8, else `view` itself.
WeightView EngineLayout(const WeightView& view, HugePageBuffer* packed);

// Zero weights of one type in the engine's layout (the kernels' speed does not depend
// on the values), streamed by MatMul one matrix at a time.
class WeightStreamProbe {
 public:
  explicit WeightStreamProbe(WeightType type, const RateProbeOptions& options = {});

  // Seconds of one pass of MatMul over `tokens` token rows through every matrix, on
  // `pool` (null: the calling thread): the mean over the passes of options.seconds.
  double SecondsPerPass(int64_t tokens, ThreadPool* pool) const;

  // Bytes of the matrices as the kernel reads them (the engine's layout: Q4_K rows
  // take 148 bytes per 256 columns, not 144) — what LlamaWeights counts as a decode
  // step's bytes — and as the GGUF file stores them (what the planner's sizes count).
  int64_t read_bytes() const { return num_matrices_ * matrix_rows_ * read_row_bytes_; }
  int64_t gguf_bytes() const { return num_matrices_ * matrix_rows_ * gguf_row_bytes_; }
  int64_t num_matrices() const { return num_matrices_; }  // MatMul calls per pass

 private:
  WeightType type_;
  double seconds_;
  int64_t matrix_rows_, matrix_cols_;
  int64_t num_matrices_ = 0;
  int64_t gguf_row_bytes_ = 0, read_row_bytes_ = 0;
  HugePageBuffer weights_;  // [num_matrices × matrix_rows, read_row_bytes]
  WeightView view_;         // all of weights_, in the engine's layout
};

// FLOP/s of MatMul over options.gemm_tokens tokens of one gemm_dim² matrix of `type`
// (the engine's layout), on `pool` (null: the calling thread).
double MeasureGemmFlops(WeightType type, const RateProbeOptions& options, ThreadPool* pool);

// The rates `tessera plan --calibrate` records for one weight type; stream rates in
// GGUF bytes per second (the planner's model sizes are GGUF bytes), each the median
// of three rounds in which the figures of one probe take turns.
struct KernelRates {
  double gemv_bytes_per_s = 0;      // one thread
  double gemv_all_bytes_per_s = 0;  // every thread of `all_cores` together
  double gemm_flops = 0;            // one thread
  // Over a few token rows (4 and 16: a decode batch, a pipeline micro-batch), the
  // same matrices: one thread, and all of `all_cores`. Row count -> bytes/s.
  std::map<int64_t, double> rows_bytes_per_s;
  std::map<int64_t, double> rows_all_bytes_per_s;
  // The one-row GEMV over each row length of options.sweep_cols, and a call's fixed
  // cost (MeasureColumnSweep): one thread, and all of `all_cores`.
  std::map<int64_t, double> cols_bytes_per_s;
  std::map<int64_t, double> cols_all_bytes_per_s;
  double call_seconds = 0;
  double call_all_seconds = 0;
};

// The one-row GEMV by matrix shape, on `pool` (null: the calling thread).
struct ColumnSweep {
  // GGUF weight bytes per second over matrix_rows × c matrices for each c of
  // options.sweep_cols. Columns -> bytes/s.
  std::map<int64_t, double> bytes_per_s;
  // What one MatMul call costs besides its bytes (thread start, activations, the
  // streams' ramp): fitted as t = call_seconds + bytes / rate from the
  // matrix_rows × matrix_cols and short_rows × matrix_cols matrices (one row length,
  // 8× the bytes per call); at least 0.
  double call_seconds = 0;
};

// The shapes take turns in three rounds of options.seconds / 3 each and each reports
// its median: what matters is how they compare, and the machine's speed drifts
// between measurements taken one after another.
ColumnSweep MeasureColumnSweep(WeightType type, const RateProbeOptions& options, ThreadPool* pool);

// Every KernelRates figure of `type`; `all_cores` is a pool of one thread per core.
KernelRates MeasureKernelRates(WeightType type, ThreadPool& all_cores,
                               const RateProbeOptions& options = {});

}  // namespace tessera::kernels
