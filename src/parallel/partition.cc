#include "parallel/partition.h"

#include <algorithm>
#include <charconv>
#include <limits>

namespace tessera::parallel {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

// Contiguous split of `bytes` into `parts` non-empty ranges minimising the largest
// sum, where the last range also carries `tail` (dynamic programming; ties go to
// earlier cuts, so equal layers split as evenly as possible front-loaded).
std::vector<LayerRange> Balance(const std::vector<int64_t>& bytes, int parts, int64_t tail) {
  const int n = static_cast<int>(bytes.size());
  std::vector<int64_t> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + bytes[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // cost[p][i]: best max over the first i layers in p parts; cut[p][i]: start of part p.
  std::vector<std::vector<int64_t>> cost(parts + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  cost[0][0] = 0;
  for (int p = 1; p <= parts; ++p) {
    for (int i = p; i <= n; ++i) {
      for (int j = p - 1; j < i; ++j) {
        if (cost[p - 1][j] == kInf) continue;
        int64_t part = prefix[i] - prefix[j] + (p == parts && i == n ? tail : 0);
        int64_t c = std::max(cost[p - 1][j], part);
        // Prefer the more even layer count on ties.
        if (c < cost[p][i]) {
          cost[p][i] = c;
          cut[p][i] = j;
        }
      }
    }
  }
  std::vector<LayerRange> ranges(static_cast<size_t>(parts));
  int end = n;
  for (int p = parts; p >= 1; --p) {
    const int begin = cut[p][end];
    ranges[static_cast<size_t>(p - 1)] = {begin, end};
    end = begin;
  }
  return ranges;
}

Result<std::vector<LayerRange>> ParseStageLayers(const std::string& text, int pp,
                                                 int64_t num_layers) {
  std::vector<LayerRange> ranges;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item(text.data() + pos, comma - pos);
    const size_t dash = item.find('-');
    int64_t first = -1, last = -1;
    bool ok = dash != std::string_view::npos;
    if (ok) {
      auto r1 = std::from_chars(item.data(), item.data() + dash, first);
      auto r2 = std::from_chars(item.data() + dash + 1, item.data() + item.size(), last);
      ok = r1.ec == std::errc() && r1.ptr == item.data() + dash && r2.ec == std::errc() &&
           r2.ptr == item.data() + item.size();
    }
    if (!ok) {
      return InvalidArgumentError("--pp-layers: '" + std::string(item) +
                                  "' is not a layer range like 0-10");
    }
    const int64_t expected = ranges.empty() ? 0 : ranges.back().end;
    if (first != expected || last < first) {
      return InvalidArgumentError("--pp-layers: range " + std::string(item) +
                                  " should start at layer " + S(expected) +
                                  " and not end before it starts");
    }
    ranges.push_back({first, last + 1});
    pos = comma + 1;
  }
  if (static_cast<int>(ranges.size()) != pp) {
    return InvalidArgumentError("--pp-layers gives " + S(static_cast<int64_t>(ranges.size())) +
                                " stages, --pp is " + S(pp));
  }
  if (ranges.back().end != num_layers) {
    return InvalidArgumentError("--pp-layers ends at layer " + S(ranges.back().end - 1) +
                                ", the model's last layer is " + S(num_layers - 1));
  }
  return ranges;
}

}  // namespace

std::string Partition::ToString() const {
  std::string s = "tp" + S(tp) + (cp > 1 ? " cp" + S(cp) : std::string()) +
                  (dp > 1 ? " dp" + S(dp) : std::string()) +
                  (ep > 1 ? " ep" + S(ep) : std::string()) +
                  (sp ? std::string(" sp") : std::string()) + " pp" + S(pp);
  if (pp > 1) {
    s += ", stages";
    for (size_t i = 0; i < stage_layers.size(); ++i) {
      s += (i == 0 ? " " : " | ") + S(stage_layers[i].begin) + "-" + S(stage_layers[i].end - 1);
    }
  }
  return s;
}

Result<Partition> MakePartition(const PartitionRequest& request,
                                const std::vector<int64_t>& layer_bytes, int64_t head_bytes) {
  const int64_t num_layers = static_cast<int64_t>(layer_bytes.size());
  if (request.tp < 1 || request.pp < 1 || request.cp < 1) {
    return InvalidArgumentError("--tp, --pp and --cp must be at least 1 (got tp " + S(request.tp) +
                                ", pp " + S(request.pp) + ", cp " + S(request.cp) + ")");
  }
  if (request.cp > 1 && (request.ep > 1 || request.sp)) {
    return InvalidArgumentError(std::string("--cp is not supported with ") +
                                (request.ep > 1 ? "--ep" : "--sp") +
                                " yet: context parallelism runs a stage's tokens unsplit over "
                                "its tp ranks");
  }
  if (request.dp < 1) {
    return InvalidArgumentError("--dp must be at least 1 (got " + S(request.dp) + ")");
  }
  if (request.dp > 1) {
    // Data-parallel attention: each rank whole but for its experts.
    if (request.ep != request.dp) {
      return InvalidArgumentError(
          "data-parallel attention (--dp " + S(request.dp) + " in one rank group) needs --ep " +
          S(request.dp) + " (got --ep " + S(request.ep) + "): the dp ranks split the experts");
    }
    if (request.tp > 1 || request.cp > 1 || request.pp > 1 || request.sp) {
      return InvalidArgumentError(
          std::string("data-parallel attention (--dp with --ep) is not supported with ") +
          (request.tp > 1   ? "--tp"
           : request.cp > 1 ? "--cp"
           : request.pp > 1 ? "--pp"
                            : "--sp") +
          " yet: each dp rank runs its sequences' attention whole");
    }
  } else if (request.ep < 1 || request.tp % request.ep != 0) {
    return InvalidArgumentError("--ep (" + S(request.ep) + ") must divide --tp (" + S(request.tp) +
                                "): the expert-parallel ranks are a stage's tensor-parallel ranks");
  }
  if (request.sp && request.tp < 2) {
    return InvalidArgumentError(
        "--sp splits a step's tokens over the tensor-parallel ranks: it "
        "needs --tp 2 or more (got " +
        S(request.tp) + ")");
  }
  if (request.sp && request.ep > 1) {
    return InvalidArgumentError(
        "--sp is not supported with --ep: sequence parallelism runs "
        "dense layers only");
  }
  if (request.ep_redundant < 0) {
    return InvalidArgumentError("--ep-redundant must be at least 0 (got " +
                                S(request.ep_redundant) + ")");
  }
  if (request.ep == 1 && (request.ep_redundant > 0 || !request.expert_placement.empty())) {
    return InvalidArgumentError(
        "--ep-redundant and --ep-placement place experts over EP ranks: "
        "they need --ep 2 or more");
  }
  if (request.sp_min_tokens < 1) {
    return InvalidArgumentError("--sp-min-tokens must be at least 1 (got " +
                                S(request.sp_min_tokens) + ")");
  }
  if (request.pp > num_layers) {
    return InvalidArgumentError("pp (" + S(request.pp) + ") exceeds the model's " + S(num_layers) +
                                " layers");
  }
  Partition plan;
  plan.tp = request.tp;
  plan.pp = request.pp;
  plan.cp = request.cp;
  plan.ep = request.ep;
  plan.dp = request.dp;
  plan.ep_redundant = request.ep_redundant;
  plan.expert_placement = request.expert_placement;
  plan.sp = request.sp;
  plan.sp_min_tokens = request.sp_min_tokens;
  if (request.pp_layers.empty()) {
    plan.stage_layers = Balance(layer_bytes, plan.pp, head_bytes);
  } else {
    TESSERA_ASSIGN_OR_RETURN(plan.stage_layers,
                             ParseStageLayers(request.pp_layers, plan.pp, num_layers));
  }
  for (const LayerRange& r : plan.stage_layers) {
    int64_t bytes = 0;
    for (int64_t l = r.begin; l < r.end; ++l) bytes += layer_bytes[static_cast<size_t>(l)];
    plan.stage_bytes.push_back(bytes);
  }
  plan.stage_bytes.back() += head_bytes;
  return plan;
}

}  // namespace tessera::parallel
