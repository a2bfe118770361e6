// Where a mixture-of-experts model's experts live under expert parallelism: for
// each expert, the EP ranks holding a copy (the first is its home). By default
// expert e lives on rank e / (num_experts / ep) alone; with redundant slots (EPLB
// style) a rank may also hold copies of other, hotter experts, and a token routed
// to a replicated expert is computed by one of its holders (model/moe_ep.cc picks
// the least loaded so far, the token's own rank on a tie).
// Replicas hold identical weights and the kernels are batch-invariant, so the
// placement never changes a result. One table may serve every MoE layer, or each
// layer has its own (a layer's hot experts are its own: EPLB places per layer).
// Layer: parallel (tables of ints, checked against the model's expert count).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::parallel {

// One layer's table: holders[e], the EP ranks holding expert e, home first, no
// rank twice.
using ExpertHolders = std::vector<std::vector<int>>;

struct ExpertPlacement {
  ExpertHolders holders;  // every layer's, when `layers` is empty
  // Per layer: layers[l] is global layer l's table (every layer of the model).
  std::vector<ExpertHolders> layers;

  bool empty() const { return holders.empty() && layers.empty(); }
  bool per_layer() const { return !layers.empty(); }
  // Layer l's table.
  const ExpertHolders& Of(int64_t layer) const {
    return layers.empty() ? holders : layers[static_cast<size_t>(layer)];
  }
  // The experts `ep_rank` holds in `layer`, ascending.
  std::vector<int32_t> HeldBy(int ep_rank, int64_t layer = 0) const;
  // {"experts": [[0], [0, 1], …]} (one list of holding ranks per expert), or per
  // layer {"layers": [[[0], [0, 1], …], …]}.
  std::string ToJson() const;
  // For a step message (parallel/step_message.h): the number of layer tables (0:
  // one for every layer), the expert count, then each table: per expert, its
  // holder count, then the holders.
  std::vector<int32_t> ToInts() const;
};

// ToInts' list back (InvalidArgument on a count running past the end; a lying
// peer's placement is then checked by CheckExpertPlacement).
Result<ExpertPlacement> PlacementFromInts(std::span<const int32_t> ints);

// The default: expert e on rank e / (num_experts / ep) alone.
ExpertPlacement ContiguousPlacement(int64_t num_experts, int ep);

// InvalidArgument unless in every table every expert of [0, num_experts) has one
// to ep holders, all in [0, ep) and distinct, and no rank holds more than
// num_experts / ep + redundant experts (its slots), and a per-layer placement has
// num_layers tables. The message names the layer, expert or rank at fault.
Status CheckExpertPlacement(const ExpertPlacement& placement, int64_t num_experts, int ep,
                            int redundant, int64_t num_layers);

// Parses ToJson's format (InvalidArgument on bad syntax; CheckExpertPlacement after).
Result<ExpertPlacement> ParseExpertPlacement(const std::string& json);

// A placement for the measured load (rows routed to each expert): every expert at
// home, then each of the ep × redundant replica slots, greedily, given to the
// expert with the most rows per copy, on the least loaded rank with a free slot
// that lacks it (a rank's load: its experts' rows divided among their copies),
// if that rank stays below the expert's busiest holder with its share (slots
// where no copy helps stay free). Minimises the busiest rank's rows as far as
// greedy placement does.
ExpertPlacement BalanceExperts(const std::vector<int64_t>& rows_per_expert, int ep, int redundant);

// The same for each layer's load (rows_by_layer[l][e], every layer of the model): a
// per-layer placement.
ExpertPlacement BalanceExpertsByLayer(const std::vector<std::vector<int64_t>>& rows_by_layer,
                                      int ep, int redundant);

// Rows each rank would compute under `holders` for that load, if every expert's
// rows split evenly over its copies (the balance BalanceExperts aims at).
std::vector<double> ExpectedRankRows(const ExpertHolders& holders,
                                     const std::vector<int64_t>& rows_per_expert, int ep);

// The busiest rank's expected rows summed over the layers (each layer waits for
// its busiest rank), over the mean rank's: 1 is perfect balance (1 for no load).
double BusiestOverMean(const ExpertPlacement& placement,
                       const std::vector<std::vector<int64_t>>& rows_by_layer, int ep);

}  // namespace tessera::parallel
