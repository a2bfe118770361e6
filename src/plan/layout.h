// Parallelism degrees (tp, pp, dp, ep, cp) and layouts (one set of degrees, or a
// prefill/decode split with one for each side); the rules that decide whether a
// layout can divide a model, and the enumeration of all that can. Layer: plan.
//
// Rank order inside one instance (innermost first): tp, cp, dp, pp — a stage's
// tp×cp×dp ranks are contiguous (kept inside a node when they fit), stages outermost.
// EP groups are ep consecutive ranks of a stage's tp×dp ranks (cp = 1 with ep > 1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/cluster.h"
#include "plan/dtype.h"
#include "plan/model_shape.h"

namespace tessera::plan {

struct Parallelism {
  int64_t tp = 1;  // tensor parallel: heads, FFN columns and vocab split
  int64_t pp = 1;  // pipeline stages (contiguous layer ranges)
  int64_t dp = 1;  // data-parallel replicas (no communication between them, except EP)
  int64_t ep = 1;  // expert parallel: experts spread over ep ranks of a stage's tp×dp
  int64_t cp = 1;  // context parallel: the sequence split over cp ranks
  // Sequence parallelism inside the tp groups (dense models): 0 = off, N = steps of
  // at least N tokens split their rows over the tp ranks (the engine's --sp with
  // --sp-min-tokens N; "sp=N" in a layout string).
  int64_t sp = 0;

  int64_t devices() const { return tp * pp * dp * cp; }
  // "tp2 pp2" (degrees of 1 left out; "tp1" if all are 1); "tp2 sp" / "tp2 sp>=64".
  std::string ToString() const;
  bool SequenceParallelFor(int64_t tokens) const { return sp > 0 && tp > 1 && tokens >= sp; }
  bool operator==(const Parallelism&) const = default;
};

struct Layout {
  Parallelism decode;                  // the serving instances (all of them when there is no split)
  std::optional<Parallelism> prefill;  // prefill/decode disaggregation: prefill instances

  int64_t devices() const { return decode.devices() + (prefill ? prefill->devices() : 0); }
  std::string ToString() const;  // "tp4 dp2" or "P[tp4] D[dp4]"
};

// Parses "tp=2,pp=2,ep=2" (missing degrees are 1); InvalidArgument on bad syntax.
Result<Parallelism> ParseParallelism(std::string_view text);

// The layer range [first, end) of pipeline stage `stage`: layers split as evenly as
// possible, the first n_layers % pp stages one layer longer.
struct LayerRange {
  int64_t first = 0;
  int64_t end = 0;
  int64_t size() const { return end - first; }
};
LayerRange StageLayers(int64_t n_layers, int64_t pp, int64_t stage);

// Whether `p` can divide `model` stored as `weight_dtype`; InvalidArgument naming
// the broken constraint ("tp (3) must divide the query heads (32)").
Status ValidateParallelism(const ModelShape& model, const DType& weight_dtype,
                           const Parallelism& p);
// ValidateParallelism for each side plus the device count against the cluster.
Status ValidateLayout(const ModelShape& model, const Cluster& cluster, const DType& weight_dtype,
                      const Layout& layout);

struct EnumerateOptions {
  bool prefill_decode_split = false;  // also pair prefill instances with decode instances
  bool context_parallel = true;       // also try cp > 1
  int64_t max_layouts = 200000;       // cap on the PD pairs
};

// Every layout that passes ValidateLayout on at most cluster.total_devices() devices.
std::vector<Layout> EnumerateLayouts(const ModelShape& model, const Cluster& cluster,
                                     const DType& weight_dtype, const EnumerateOptions& options);

}  // namespace tessera::plan
