// Where an expert-parallel rank keeps its experts' weights (issue 30): a fixed
// number of slots a layer — num_experts / ep home experts plus ep_redundant
// copies (ShardLayout::expert_slots) — each one expert's gate, up and down
// matrices, carved from one buffer at load. A matrix the matmul reads interleaved
// (kernels::CanInterleave8) is written into its slot; any other stays a view of
// the mapped file and its slot part is empty. The buffer's pages are committed as
// slots are first written, so unused replica slots cost address space only.
//
// PlaceExperts makes a layer hold exactly the experts a placement gives the rank:
// an expert it keeps stays where it is, a dropped one frees its slot (its mapped
// pages, for a view, are released), a new one is copied from the file into a free
// slot. Run between steps, it is the live re-placement of hot-expert replicas: a
// replica's bytes are the file's, interleaved as at load, so results never change.
// Layer: model. Not thread-safe: no step may run while experts move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/huge_page_buffer.h"
#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"

namespace tessera::model {

struct LlamaLayerWeights;
struct ShardLayout;

struct ExpertSlots {
  HugePageBuffer buffer;  // [layers, slots, slot_bytes]
  int64_t slots = 0;      // a layer
  // Bytes of each part of a slot (0: the matrix stays a view of the file).
  size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;
  // [layer][slot]: the expert in it, -1 while free.
  std::vector<std::vector<int32_t>> expert;

  size_t slot_bytes() const { return gate_bytes + up_bytes + down_bytes; }
};

// Sizes and maps the slots of `layers` (the rank's layers, their experts not bound
// yet) for `layout` (ep_size > 1); ResourceExhausted if the buffer cannot be mapped.
Result<ExpertSlots> CreateExpertSlots(const GgufFile& file, const ModelConfig& config,
                                      const ShardLayout& layout);

// Binds exactly the experts held[i] (ascending) in layers[i] (global layer
// layout.layers.begin + i), moving only those that change, as the file comment
// says. InvalidArgument, before anything moves, when some layer's are more
// experts than a layer has slots.
Status PlaceExperts(const GgufFile& file, const ShardLayout& layout,
                    const std::vector<std::vector<int32_t>>& held,
                    std::vector<LlamaLayerWeights>& layers, ExpertSlots& slots);

}  // namespace tessera::model
