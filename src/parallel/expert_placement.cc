#include "parallel/expert_placement.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/check.h"

namespace tessera::parallel {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

}  // namespace

std::vector<int32_t> ExpertPlacement::HeldBy(int ep_rank, int64_t layer) const {
  const ExpertHolders& table = Of(layer);
  std::vector<int32_t> held;
  for (size_t e = 0; e < table.size(); ++e) {
    if (std::find(table[e].begin(), table[e].end(), ep_rank) != table[e].end()) {
      held.push_back(static_cast<int32_t>(e));
    }
  }
  return held;
}

std::string ExpertPlacement::ToJson() const {
  nlohmann::json j;
  if (per_layer()) {
    j["layers"] = layers;
  } else {
    j["experts"] = holders;
  }
  return j.dump();
}

std::vector<int32_t> ExpertPlacement::ToInts() const {
  const size_t num_experts = per_layer() ? layers[0].size() : holders.size();
  std::vector<int32_t> ints = {static_cast<int32_t>(layers.size()),
                               static_cast<int32_t>(num_experts)};
  auto put = [&ints](const ExpertHolders& table) {
    for (const std::vector<int>& h : table) {
      ints.push_back(static_cast<int32_t>(h.size()));
      ints.insert(ints.end(), h.begin(), h.end());
    }
  };
  if (per_layer()) {
    for (const ExpertHolders& table : layers) put(table);
  } else {
    put(holders);
  }
  return ints;
}

Result<ExpertPlacement> PlacementFromInts(std::span<const int32_t> ints) {
  if (ints.size() < 2 || ints[0] < 0 || ints[1] < 0) {
    return InvalidArgumentError(
        "an expert placement's list starts without its table and expert "
        "counts (no holders)");
  }
  size_t i = 2;
  auto table = [&](ExpertHolders& out) -> Status {
    for (int32_t e = 0; e < ints[1]; ++e) {
      const int32_t n = i < ints.size() ? ints[i++] : -1;
      if (n < 0 || static_cast<size_t>(n) > ints.size() - i) {
        return InvalidArgumentError("an expert placement's expert " + S(e) + " names " + S(n) +
                                    " holders, " + S(ints.size() - i) + " values left");
      }
      out.emplace_back(ints.begin() + static_cast<ptrdiff_t>(i),
                       ints.begin() + static_cast<ptrdiff_t>(i + static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    }
    return Status::Ok();
  };
  ExpertPlacement p;
  if (ints[0] == 0) {
    TESSERA_RETURN_IF_ERROR(table(p.holders));
  } else {
    for (int32_t l = 0; l < ints[0]; ++l) TESSERA_RETURN_IF_ERROR(table(p.layers.emplace_back()));
  }
  if (i != ints.size()) {
    return InvalidArgumentError("an expert placement's list has " + S(ints.size() - i) +
                                " values past its tables' holders");
  }
  return p;
}

ExpertPlacement ContiguousPlacement(int64_t num_experts, int ep) {
  ExpertPlacement p;
  const int64_t per_rank = num_experts / ep;
  TESSERA_CHECK(per_rank >= 1 && num_experts % ep == 0) << num_experts << " experts, ep " << ep;
  for (int64_t e = 0; e < num_experts; ++e) p.holders.push_back({static_cast<int>(e / per_rank)});
  return p;
}

namespace {

Status CheckTable(const ExpertHolders& table, int64_t num_experts, int ep, int redundant) {
  if (static_cast<int64_t>(table.size()) != num_experts) {
    return InvalidArgumentError("the expert placement lists " + S(table.size()) +
                                " experts; the model has " + S(num_experts));
  }
  std::vector<int64_t> held(static_cast<size_t>(ep), 0);
  for (size_t e = 0; e < table.size(); ++e) {
    const std::vector<int>& h = table[e];
    if (h.empty()) return InvalidArgumentError("expert " + S(e) + " has no rank holding it");
    for (size_t i = 0; i < h.size(); ++i) {
      if (h[i] < 0 || h[i] >= ep) {
        return InvalidArgumentError("expert " + S(e) + " is placed on EP rank " + S(h[i]) +
                                    ", outside [0, " + S(ep) + ")");
      }
      if (std::find(h.begin(), h.begin() + static_cast<ptrdiff_t>(i), h[i]) !=
          h.begin() + static_cast<ptrdiff_t>(i)) {
        return InvalidArgumentError("expert " + S(e) + " is placed twice on EP rank " + S(h[i]));
      }
      ++held[static_cast<size_t>(h[i])];
    }
  }
  const int64_t slots = num_experts / ep + redundant;
  for (int r = 0; r < ep; ++r) {
    if (held[static_cast<size_t>(r)] > slots) {
      return InvalidArgumentError("EP rank " + S(r) + " would hold " +
                                  S(held[static_cast<size_t>(r)]) + " experts; it has " + S(slots) +
                                  " slots (" + S(num_experts / ep) + " + --ep-redundant " +
                                  S(redundant) + ")");
    }
  }
  return Status::Ok();
}

Result<ExpertHolders> ParseTable(const nlohmann::json& experts) {
  if (!experts.is_array()) return InvalidArgumentError("a table of experts is not a list");
  ExpertHolders table;
  for (const nlohmann::json& ranks : experts) {
    if (!ranks.is_array()) {
      return InvalidArgumentError("expert " + S(table.size()) +
                                  "'s entry is not a list of EP ranks");
    }
    std::vector<int>& h = table.emplace_back();
    for (const nlohmann::json& r : ranks) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > (1 << 20)) {
        return InvalidArgumentError("expert " + S(table.size() - 1) +
                                    " lists a holder that is not an EP rank: " + r.dump());
      }
      h.push_back(r.get<int>());
    }
  }
  return table;
}

}  // namespace

Status CheckExpertPlacement(const ExpertPlacement& placement, int64_t num_experts, int ep,
                            int redundant, int64_t num_layers) {
  if (!placement.per_layer()) return CheckTable(placement.holders, num_experts, ep, redundant);
  if (static_cast<int64_t>(placement.layers.size()) != num_layers) {
    return InvalidArgumentError("the expert placement has " + S(placement.layers.size()) +
                                " layer tables; the model has " + S(num_layers) + " layers");
  }
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    TESSERA_RETURN_IF_ERROR(
        CheckTable(placement.layers[l], num_experts, ep, redundant).WithContext("layer " + S(l)));
  }
  return Status::Ok();
}

Result<ExpertPlacement> ParseExpertPlacement(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  const bool one = j.is_object() && j.contains("experts") && j["experts"].is_array();
  const bool by_layer = j.is_object() && j.contains("layers") && j["layers"].is_array();
  if (j.is_discarded() || one == by_layer) {
    return InvalidArgumentError(
        "an expert placement is a JSON object {\"experts\": [[rank, …], …]} (one list of EP "
        "ranks per expert) or {\"layers\": [[[rank, …], …], …]} (such a table per layer)");
  }
  ExpertPlacement p;
  if (one) {
    TESSERA_ASSIGN_OR_RETURN(p.holders, ParseTable(j["experts"]));
    return p;
  }
  for (const nlohmann::json& table : j["layers"]) {
    Result<ExpertHolders> parsed = ParseTable(table);
    if (!parsed.ok()) return parsed.status().WithContext("layer " + S(p.layers.size()));
    p.layers.push_back(*std::move(parsed));
  }
  if (p.layers.empty()) return InvalidArgumentError("an expert placement with no layer tables");
  return p;
}

std::vector<double> ExpectedRankRows(const ExpertHolders& holders,
                                     const std::vector<int64_t>& rows_per_expert, int ep) {
  std::vector<double> load(static_cast<size_t>(ep), 0.0);
  for (size_t e = 0; e < holders.size() && e < rows_per_expert.size(); ++e) {
    const std::vector<int>& h = holders[e];
    for (int r : h) {
      load[static_cast<size_t>(r)] +=
          static_cast<double>(rows_per_expert[e]) / static_cast<double>(h.size());
    }
  }
  return load;
}

ExpertPlacement BalanceExperts(const std::vector<int64_t>& rows_per_expert, int ep, int redundant) {
  const int64_t num_experts = static_cast<int64_t>(rows_per_expert.size());
  ExpertPlacement p = ContiguousPlacement(num_experts, ep);
  std::vector<int64_t> free_slots(static_cast<size_t>(ep), redundant);
  for (int64_t slot = 0; slot < int64_t{ep} * redundant; ++slot) {
    const std::vector<double> load = ExpectedRankRows(p.holders, rows_per_expert, ep);
    // The expert whose copies carry the most rows each, that some free rank lacks.
    int64_t best_expert = -1;
    int best_rank = -1;
    double best_per_copy = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      const std::vector<int>& h = p.holders[static_cast<size_t>(e)];
      const double per_copy = static_cast<double>(rows_per_expert[static_cast<size_t>(e)]) /
                              static_cast<double>(h.size());
      if (per_copy <= best_per_copy) continue;
      int rank = -1;
      for (int r = 0; r < ep; ++r) {
        if (free_slots[static_cast<size_t>(r)] == 0) continue;
        if (std::find(h.begin(), h.end(), r) != h.end()) continue;
        if (rank < 0 || load[static_cast<size_t>(r)] < load[static_cast<size_t>(rank)]) rank = r;
      }
      if (rank < 0) continue;
      // Only a copy that helps: the rank taking a share must stay below the
      // busiest holder's load (a copy of a cold expert on a busy rank adds work).
      double busiest_holder = 0;
      for (int r : h) busiest_holder = std::max(busiest_holder, load[static_cast<size_t>(r)]);
      const double share = static_cast<double>(rows_per_expert[static_cast<size_t>(e)]) /
                           static_cast<double>(h.size() + 1);
      if (load[static_cast<size_t>(rank)] + share >= busiest_holder) continue;
      best_expert = e;
      best_rank = rank;
      best_per_copy = per_copy;
    }
    if (best_expert < 0 || best_per_copy <= 0) break;  // nothing left worth a copy
    p.holders[static_cast<size_t>(best_expert)].push_back(best_rank);
    --free_slots[static_cast<size_t>(best_rank)];
  }
  return p;
}

ExpertPlacement BalanceExpertsByLayer(const std::vector<std::vector<int64_t>>& rows_by_layer,
                                      int ep, int redundant) {
  ExpertPlacement p;
  for (const std::vector<int64_t>& rows : rows_by_layer) {
    p.layers.push_back(BalanceExperts(rows, ep, redundant).holders);
  }
  return p;
}

double BusiestOverMean(const ExpertPlacement& placement,
                       const std::vector<std::vector<int64_t>>& rows_by_layer, int ep) {
  double busiest = 0, total = 0;
  for (size_t l = 0; l < rows_by_layer.size(); ++l) {
    const std::vector<double> rows =
        ExpectedRankRows(placement.Of(static_cast<int64_t>(l)), rows_by_layer[l], ep);
    busiest += *std::max_element(rows.begin(), rows.end());
    for (double v : rows) total += v;
  }
  return total > 0 ? busiest / (total / ep) : 1;
}

}  // namespace tessera::parallel
