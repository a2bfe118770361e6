#include "parallel/expert_placement.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/check.h"

namespace tessera::parallel {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

}  // namespace

std::vector<int32_t> ExpertPlacement::HeldBy(int ep_rank) const {
  std::vector<int32_t> held;
  for (size_t e = 0; e < holders.size(); ++e) {
    if (std::find(holders[e].begin(), holders[e].end(), ep_rank) != holders[e].end()) {
      held.push_back(static_cast<int32_t>(e));
    }
  }
  return held;
}

std::string ExpertPlacement::ToJson() const {
  nlohmann::json j;
  j["experts"] = holders;
  return j.dump();
}

std::vector<int32_t> ExpertPlacement::ToInts() const {
  std::vector<int32_t> ints;
  for (const std::vector<int>& h : holders) {
    ints.push_back(static_cast<int32_t>(h.size()));
    ints.insert(ints.end(), h.begin(), h.end());
  }
  return ints;
}

Result<ExpertPlacement> PlacementFromInts(std::span<const int32_t> ints) {
  ExpertPlacement p;
  for (size_t i = 0; i < ints.size();) {
    const int32_t n = ints[i++];
    if (n < 0 || static_cast<size_t>(n) > ints.size() - i) {
      return InvalidArgumentError("an expert placement's expert " + S(p.holders.size()) +
                                  " names " + S(n) + " holders, " + S(ints.size() - i) +
                                  " values left");
    }
    p.holders.emplace_back(ints.begin() + static_cast<ptrdiff_t>(i),
                           ints.begin() + static_cast<ptrdiff_t>(i + static_cast<size_t>(n)));
    i += static_cast<size_t>(n);
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

Status CheckExpertPlacement(const ExpertPlacement& placement, int64_t num_experts, int ep,
                            int redundant) {
  if (static_cast<int64_t>(placement.holders.size()) != num_experts) {
    return InvalidArgumentError("the expert placement lists " + S(placement.holders.size()) +
                                " experts; the model has " + S(num_experts));
  }
  std::vector<int64_t> held(static_cast<size_t>(ep), 0);
  for (size_t e = 0; e < placement.holders.size(); ++e) {
    const std::vector<int>& h = placement.holders[e];
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

Result<ExpertPlacement> ParseExpertPlacement(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("experts") || !j["experts"].is_array()) {
    return InvalidArgumentError(
        "an expert placement is a JSON object {\"experts\": [[rank, …], …]} (one list of EP "
        "ranks per expert)");
  }
  ExpertPlacement p;
  for (const nlohmann::json& ranks : j["experts"]) {
    if (!ranks.is_array()) {
      return InvalidArgumentError("expert " + S(p.holders.size()) +
                                  "'s entry is not a list of EP ranks");
    }
    std::vector<int>& h = p.holders.emplace_back();
    for (const nlohmann::json& r : ranks) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > (1 << 20)) {
        return InvalidArgumentError("expert " + S(p.holders.size() - 1) +
                                    " lists a holder that is not an EP rank: " + r.dump());
      }
      h.push_back(r.get<int>());
    }
  }
  return p;
}

std::vector<double> ExpectedRankRows(const ExpertPlacement& placement,
                                     const std::vector<int64_t>& rows_per_expert, int ep) {
  std::vector<double> load(static_cast<size_t>(ep), 0.0);
  for (size_t e = 0; e < placement.holders.size() && e < rows_per_expert.size(); ++e) {
    const std::vector<int>& h = placement.holders[e];
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
    const std::vector<double> load = ExpectedRankRows(p, rows_per_expert, ep);
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

}  // namespace tessera::parallel
