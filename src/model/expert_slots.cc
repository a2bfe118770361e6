#include "model/expert_slots.h"

#include <algorithm>
#include <string>

#include "base/check.h"
#include "kernels/matmul.h"
#include "model/llama_weights.h"
#include "model/shard.h"

namespace tessera::model {
namespace {

// The bytes a slot keeps for `m`: its interleaved rows, or 0 for a matrix the
// matmul reads from the file as it is.
size_t SlotPartBytes(const WeightMatrix& m) {
  if (!kernels::CanInterleave8(m.view())) return 0;
  return HugePageArena::RoundedBytes(
      static_cast<size_t>(kernels::Interleaved8RowBytes(m.type, m.cols) * m.rows));
}

struct LayerExperts {
  std::vector<WeightMatrix> gate, up, down;
};

LayerExperts ExpertsOf(const GgufFile& file, int64_t layer) {
  return {ExpertMatrices(file, BlockTensorName(layer, "ffn_gate_exps.weight")),
          ExpertMatrices(file, BlockTensorName(layer, "ffn_up_exps.weight")),
          ExpertMatrices(file, BlockTensorName(layer, "ffn_down_exps.weight"))};
}

// Drops `bytes` of the mapping from this process's memory (a no-op for bytes
// not mapped from a file).
void ReleaseMapped(const GgufFile& file, std::span<const uint8_t> bytes) {
  const MappedFile* mapping = file.MappingOf(bytes);
  if (mapping == nullptr) return;
  mapping->AdviseDontNeed(static_cast<size_t>(bytes.data() - mapping->data()), bytes.size());
}

// `m` bound for the matmul: interleaved into `out` when the slot has room for
// it (its source pages then released), else `m`, a view of the file.
WeightMatrix IntoSlot(const GgufFile& file, const WeightMatrix& m, uint8_t* out, size_t bytes) {
  if (bytes == 0) return m;
  const kernels::WeightView view = kernels::Interleave8(m.view(), out);
  WeightMatrix bound = m;
  bound.data = {out, static_cast<size_t>(view.row_bytes * view.rows)};
  bound.layout = kernels::WeightLayout::kInterleaved8;
  ReleaseMapped(file, m.data);
  return bound;
}

void Unbind(const GgufFile& file, WeightMatrix& m) {
  if (m.layout == kernels::WeightLayout::kRows) ReleaseMapped(file, m.data);
  m = {};
}

}  // namespace

Result<ExpertSlots> CreateExpertSlots(const GgufFile& file, const ModelConfig& config,
                                      const ShardLayout& layout) {
  ExpertSlots slots;
  slots.slots = layout.expert_slots;
  const int64_t layers = layout.layers.size();
  slots.expert.assign(static_cast<size_t>(layers),
                      std::vector<int32_t>(static_cast<size_t>(slots.slots), -1));
  if (layers == 0 || slots.slots == 0 || config.num_experts == 0) return slots;
  // Every layer's experts have one shape and type (ValidateModelTensors); the
  // first layer's expert 0 sizes the slot.
  const LayerExperts first = ExpertsOf(file, layout.layers.begin);
  slots.gate_bytes = SlotPartBytes(first.gate[0]);
  slots.up_bytes = SlotPartBytes(first.up[0]);
  slots.down_bytes = SlotPartBytes(first.down[0]);
  const size_t bytes = static_cast<size_t>(layers * slots.slots) * slots.slot_bytes();
  if (bytes > 0) {
    Result<HugePageBuffer> buffer = HugePageBuffer::Map(bytes);
    if (!buffer.ok()) {
      return ResourceExhaustedError("no memory for " + std::to_string(slots.slots) +
                                    " expert slots a layer (" + std::to_string(bytes) +
                                    " bytes): " + buffer.status().message());
    }
    slots.buffer = std::move(*buffer);
  }
  return slots;
}

Status PlaceExperts(const GgufFile& file, const ShardLayout& layout,
                    const std::vector<std::vector<int32_t>>& held,
                    std::vector<LlamaLayerWeights>& layers, ExpertSlots& slots) {
  TESSERA_CHECK_EQ(held.size(), layers.size());
  for (size_t li = 0; li < held.size(); ++li) {
    if (static_cast<int64_t>(held[li].size()) > slots.slots) {
      return InvalidArgumentError("layer " +
                                  std::to_string(layout.layers.begin + static_cast<int64_t>(li)) +
                                  ": " + std::to_string(held[li].size()) + " experts for " +
                                  std::to_string(slots.slots) + " expert slots");
    }
  }
  for (size_t li = 0; li < layers.size(); ++li) {
    const std::vector<int32_t>& layer_held = held[li];
    auto holds = [&layer_held](size_t e) {
      return std::binary_search(layer_held.begin(), layer_held.end(), static_cast<int32_t>(e));
    };
    LlamaLayerWeights& w = layers[li];
    std::vector<int32_t>& in_slot = slots.expert[li];
    const int64_t layer = layout.layers.begin + static_cast<int64_t>(li);
    for (size_t e = 0; e < w.expert_gate.size(); ++e) {
      if (w.expert_gate[e].empty() || holds(e)) continue;
      for (auto* experts : {&w.expert_gate, &w.expert_up, &w.expert_down}) {
        Unbind(file, (*experts)[e]);
      }
      std::replace(in_slot.begin(), in_slot.end(), static_cast<int32_t>(e), -1);
    }
    std::vector<int32_t> missing;
    for (const int32_t e : layer_held) {
      if (w.expert_gate[static_cast<size_t>(e)].empty()) missing.push_back(e);
    }
    if (missing.empty()) continue;
    // Dropping first leaves slots - kept free, and held <= slots.
    TESSERA_CHECK_LE(static_cast<int64_t>(missing.size()),
                     std::count(in_slot.begin(), in_slot.end(), -1));
    const LayerExperts from = ExpertsOf(file, layer);
    for (const int32_t e : missing) {
      const auto slot =
          static_cast<size_t>(std::find(in_slot.begin(), in_slot.end(), -1) - in_slot.begin());
      uint8_t* base =
          slots.buffer.data() + (li * static_cast<size_t>(slots.slots) + slot) * slots.slot_bytes();
      const auto x = static_cast<size_t>(e);
      w.expert_gate[x] = IntoSlot(file, from.gate[x], base, slots.gate_bytes);
      w.expert_up[x] = IntoSlot(file, from.up[x], base + slots.gate_bytes, slots.up_bytes);
      w.expert_down[x] =
          IntoSlot(file, from.down[x], base + slots.gate_bytes + slots.up_bytes, slots.down_bytes);
      in_slot[slot] = e;
    }
  }
  return Status::Ok();
}

}  // namespace tessera::model
