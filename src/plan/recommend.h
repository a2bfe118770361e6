// Strategy search: estimate every layout that fits, rank them for a goal and
// explain the winner against the seeds' selection guide. Layer: plan.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "plan/estimate.h"
#include "plan/layout.h"

namespace tessera::plan {

enum class Goal {
  kLatency,     // lowest end-to-end request latency (TTFT + output × TPOT)
  kThroughput,  // most output tokens per second over the deployment
  kDevices,     // fewest devices that fit, then lowest latency
};
std::string_view GoalName(Goal goal);
Result<Goal> ParseGoal(std::string_view name);  // latency | throughput | devices

struct Plan {
  std::vector<Estimate> ranked;  // best first
  int64_t considered = 0;        // layouts enumerated
  int64_t rejected = 0;          // enumerated but not fitting
  std::string first_rejection;   // why one of them did not fit (for the message)
  std::string explanation;       // a few sentences on the winner and the seeds' guide
};

// Sorts estimates best-first for `goal` (stable; overloaded layouts go last).
void RankEstimates(Goal goal, std::vector<Estimate>& estimates);

// Estimates every enumerated layout, ranks them and explains. ResourceExhausted when
// no layout fits the cluster, with the reason for the largest one.
Result<Plan> MakePlan(const ModelShape& model, const Cluster& cluster, const Workload& workload,
                      Goal goal, const EnumerateOptions& options);

// The seeds' choice for this model and cluster (002's 选择指南 and 000's 怎么选):
// a one-line rule and whether `layout` follows it.
struct GuideAdvice {
  std::string rule;  // "does not fit one device, not MoE, fits one node -> TP (NVLink)"
  bool follows = false;
};
GuideAdvice SeedGuide(const ModelShape& model, const Cluster& cluster, const Workload& workload,
                      Goal goal, const Layout& layout);

std::string Explain(const ModelShape& model, const Cluster& cluster, const Workload& workload,
                    Goal goal, const std::vector<Estimate>& ranked);

}  // namespace tessera::plan
