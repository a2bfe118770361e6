// What `tessera plan` prints: the ranked table, the detail of one layout (memory,
// every communication item with its exact formula and the seeds' figure beside
// it), the JSON document, and the gnuplot script of the latency/throughput
// frontier. Layer: plan (text in memory; the CLI writes files and runs gnuplot).
#pragma once

#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/estimate.h"
#include "plan/model_shape.h"
#include "plan/recommend.h"
#include "plan/workload.h"

namespace tessera::plan {

struct ReportContext {
  const ModelShape& model;
  const Cluster& cluster;
  const Workload& workload;
  Goal goal;
};

// Header lines (model, cluster, workload) and the top `top` rows of the ranking.
std::string FormatTable(const ReportContext& ctx, const Plan& plan, int top);
// Memory, time breakdown and communication items of one layout.
std::string FormatDetail(const ReportContext& ctx, const Estimate& estimate);
// The whole plan (top `top` layouts with every figure) as JSON.
std::string PlanToJson(const ReportContext& ctx, const Plan& plan, int top);

// One layout's latency/throughput curve (SweepConcurrency) for the plot.
struct PlotSeries {
  std::string label;
  std::vector<SweepPoint> points;
};

// A gnuplot script drawing TPOT against throughput, one curve per series (each
// layout swept over concurrency), and the Pareto frontier over all their points
// (no other point is both faster per token and higher in throughput), into
// `png_path`.
std::string PlotScript(const ReportContext& ctx, const std::vector<PlotSeries>& series,
                       const std::string& png_path);

}  // namespace tessera::plan
