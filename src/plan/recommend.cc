#include "plan/recommend.h"

#include <algorithm>
#include <cstdio>

#include "plan/units.h"

namespace tessera::plan {
namespace {

std::string Ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g ms", seconds * 1e3);
  return buf;
}

std::string Num(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", value);
  return buf;
}

// Does the whole model (weights plus one sequence's KV) fit one device?
bool FitsOneDevice(const ModelShape& m, const Cluster& c, const Workload& w) {
  Workload one = w;
  one.concurrency = 1;
  return DeviceMemory(m, c, one, Parallelism{}).ok();
}

// Does some tp (no pp) within one node fit?
bool FitsOneNodeTp(const ModelShape& m, const Cluster& c, const Workload& w) {
  Workload one = w;
  one.concurrency = 1;
  for (int64_t tp = 2; tp <= c.devices_per_node; ++tp) {
    Parallelism p{tp, 1, 1, 1, 1};
    if (ValidateParallelism(m, w.weight_dtype, p).ok() && DeviceMemory(m, c, one, p).ok()) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string_view GoalName(Goal goal) {
  switch (goal) {
    case Goal::kLatency:
      return "latency";
    case Goal::kThroughput:
      return "throughput";
    case Goal::kDevices:
      return "devices";
  }
  return "?";
}

Result<Goal> ParseGoal(std::string_view name) {
  if (name == "latency") return Goal::kLatency;
  if (name == "throughput") return Goal::kThroughput;
  if (name == "devices" || name == "fewest-devices") return Goal::kDevices;
  return InvalidArgumentError("unknown goal '" + std::string(name) +
                              "' (known: latency, throughput, devices)");
}

void RankEstimates(Goal goal, std::vector<Estimate>& estimates) {
  auto key = [goal](const Estimate& e) {
    const double devices = static_cast<double>(e.layout.devices());
    switch (goal) {
      case Goal::kLatency:
        return std::make_tuple(e.overloaded, e.e2e_seconds, devices, -e.throughput_tokens_per_s);
      case Goal::kThroughput:
        return std::make_tuple(e.overloaded, -e.throughput_tokens_per_s, e.e2e_seconds, devices);
      case Goal::kDevices:
        return std::make_tuple(e.overloaded, devices, e.e2e_seconds, -e.throughput_tokens_per_s);
    }
    return std::make_tuple(false, 0.0, 0.0, 0.0);
  };
  std::stable_sort(estimates.begin(), estimates.end(),
                   [&](const Estimate& a, const Estimate& b) { return key(a) < key(b); });
}

GuideAdvice SeedGuide(const ModelShape& m, const Cluster& c, const Workload& w, Goal goal,
                      const Layout& layout) {
  GuideAdvice advice;
  const Parallelism& p = layout.decode;
  if (goal == Goal::kLatency && w.prompt_tokens >= 4 * w.output_tokens && c.total_devices() > 1 &&
      layout.prefill) {
    advice.rule = "long prompts and low latency -> PD split (000: 长 prompt 很多: 重点看 PD 分离)";
    advice.follows = true;
    return advice;
  }
  if (FitsOneDevice(m, c, w)) {
    if (goal == Goal::kThroughput) {
      advice.rule =
          "fits one device, wants throughput -> DP, no communication (002: 单卡能放 → DP)";
      advice.follows = p.tp == 1 && p.pp == 1 && p.cp == 1;
    } else {
      advice.rule =
          "fits one device -> run on one device; TP only if one request is too slow "
          "(002: 单GPU运行; 000: 单请求太慢: 优先看 TP)";
      advice.follows = p.pp == 1 && p.cp == 1 && p.ep == 1;
    }
  } else if (m.is_moe()) {
    advice.rule = "MoE that does not fit one device -> EP + TP/DP (002: MoE → EP)";
    advice.follows = p.ep > 1;
  } else if (FitsOneNodeTp(m, c, w)) {
    advice.rule =
        "does not fit one device, fits one node -> TP over the fast link "
        "(002: 大模型 → TP (NVLink))";
    advice.follows = p.tp > 1 && p.pp == 1 && p.tp <= c.devices_per_node;
  } else {
    advice.rule = "needs more than one node -> TP inside nodes + PP across (002: 跨节点 → TP+PP)";
    advice.follows = p.pp > 1 && p.tp <= c.devices_per_node;
  }
  return advice;
}

std::string Explain(const ModelShape& m, const Cluster& c, const Workload& w, Goal goal,
                    const std::vector<Estimate>& ranked) {
  if (ranked.empty()) return "";
  const Estimate& best = ranked.front();
  std::string text = "Best for " + std::string(GoalName(goal)) + ": " + best.layout.ToString() +
                     " on " + std::to_string(best.layout.devices()) + " device(s): TTFT " +
                     Ms(best.ttft_seconds) + ", TPOT " + Ms(best.tpot_seconds) + ", " +
                     Num(best.throughput_tokens_per_s) + " tok/s at " + Num(best.concurrency) +
                     " sequences in flight. ";
  const double step = best.decode.compute_seconds + best.decode.comm_seconds;
  if (step > 0) {
    text += "A decode step's busiest stage spends " + Ms(best.decode.compute_seconds) +
            " computing (" + (best.decode.memory_bound ? "memory-bound" : "compute-bound") +
            ") and " + Ms(best.decode.comm_seconds) + " in collectives (" +
            Num(100 * best.decode.comm_seconds / step) + "%)";
    if (best.decode.bubble_fraction > 0) {
      text += "; the pipeline idles " + Num(100 * best.decode.bubble_fraction) +
              "% (too few sequences to fill " + std::to_string(best.layout.decode.pp) + " stages)";
    }
    text += ". ";
  }
  if (best.kv_limited) {
    text += "The KV cache limits each replica to " + std::to_string(best.seqs_per_replica) +
            " sequences; more would queue. ";
  } else if (best.batch_capped) {
    text += "Each replica's decode batch is capped at " + std::to_string(best.seqs_per_replica) +
            " sequences (max_batch_seqs); more would queue. ";
  }
  const GuideAdvice advice = SeedGuide(m, c, w, goal, best.layout);
  text += "Seeds' guide: " + advice.rule + ". ";
  if (advice.follows) {
    text += "The recommendation follows it.";
    return text;
  }
  // Find the best layout that follows the guide and say what it would cost.
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (!SeedGuide(m, c, w, goal, ranked[i].layout).follows) continue;
    const Estimate& g = ranked[i];
    text += "It departs from it: the best layout that follows the guide, " + g.layout.ToString() +
            ", ranks #" + std::to_string(i + 1) + " (TTFT " + Ms(g.ttft_seconds) + ", TPOT " +
            Ms(g.tpot_seconds) + ", " + Num(g.throughput_tokens_per_s) + " tok/s)";
    if (g.decode.comm_seconds > 2 * best.decode.comm_seconds && g.decode.comm_seconds > 0) {
      text += ": its collectives take " + Ms(g.decode.comm_seconds) + " per step over " +
              (g.decode.comm.empty() ? std::string("the links")
                                     : (g.decode.comm.front().crosses_nodes ? c.inter_link.name
                                                                            : c.intra_link.name)) +
              " — the guide assumes a fast interconnect";
    } else if (g.decode.bubble_fraction > 0) {
      text += ": its pipeline idles " + Num(100 * g.decode.bubble_fraction) + "%";
    }
    text += ".";
    return text;
  }
  text += ranked.size() == 1 ? "It departs from it (only this layout was evaluated)."
                             : "It departs from it: none of the evaluated layouts follows it.";
  return text;
}

Result<Plan> MakePlan(const ModelShape& m, const Cluster& c, const Workload& w, Goal goal,
                      const EnumerateOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateModelShape(m));
  TESSERA_RETURN_IF_ERROR(ValidateCluster(c));
  Plan plan;
  const std::vector<Layout> layouts = EnumerateLayouts(m, c, w.weight_dtype, options);
  plan.considered = static_cast<int64_t>(layouts.size());
  int64_t largest_rejected = 0;
  for (const Layout& layout : layouts) {
    Result<Estimate> e = EstimateLayout(m, c, w, layout);
    if (e.ok()) {
      plan.ranked.push_back(std::move(e).value());
      continue;
    }
    ++plan.rejected;
    if (layout.devices() >= largest_rejected) {
      largest_rejected = layout.devices();
      plan.first_rejection = e.status().message();
    }
  }
  if (plan.ranked.empty()) {
    return ResourceExhaustedError(
        "no layout of '" + m.name + "' fits cluster '" + c.name + "' (" +
        std::to_string(c.total_devices()) + " devices of " + Num(c.device.memory_gb) +
        " GB); e.g. " +
        (plan.first_rejection.empty() ? std::string("none is valid") : plan.first_rejection));
  }
  RankEstimates(goal, plan.ranked);
  plan.explanation = Explain(m, c, w, goal, plan.ranked);
  return plan;
}

}  // namespace tessera::plan
