#include "model/llama_weights.h"

#include "base/check.h"

namespace tessera::model {
namespace {

// Binds tensor `name` (present and shape-checked by ValidateModelTensors).
WeightMatrix Matrix(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr) << name;
  WeightMatrix m;
  m.type = t->type;
  m.cols = t->dims[0];
  m.rows = t->num_elements / t->dims[0];
  m.data = t->data;
  m.name = t->name;
  return m;
}

std::span<const float> Vector(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr) << name;
  TESSERA_CHECK(t->type == kernels::WeightType::kF32) << name;
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(t->data.data()) % alignof(float) == 0) << name;
  return {reinterpret_cast<const float*>(t->data.data()), static_cast<size_t>(t->num_elements)};
}

std::span<const float> OptionalVector(const GgufFile& file, const std::string& name) {
  return file.FindTensor(name) ? Vector(file, name) : std::span<const float>();
}

// Splits a 3-D [cols, rows, num_experts] tensor into one matrix per expert.
std::vector<WeightMatrix> Experts(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr && t->dims.size() == 3) << name;
  const int64_t num_experts = t->dims[2];
  const size_t slab = t->data.size() / static_cast<size_t>(num_experts);
  std::vector<WeightMatrix> out;
  for (int64_t e = 0; e < num_experts; ++e) {
    WeightMatrix m;
    m.type = t->type;
    m.cols = t->dims[0];
    m.rows = t->dims[1];
    m.data = t->data.subspan(static_cast<size_t>(e) * slab, slab);
    m.name = t->name;
    out.push_back(m);
  }
  return out;
}

int64_t Bytes(const WeightMatrix& m) { return static_cast<int64_t>(m.data.size()); }

}  // namespace

Result<LlamaWeights> BindLlamaWeights(const GgufFile& file, const ModelConfig& config) {
  TESSERA_RETURN_IF_ERROR(ValidateModelTensors(file, config));
  for (const GgufTensor& t : file.tensors()) {
    if (t.type == kernels::WeightType::kF32 &&
        reinterpret_cast<uintptr_t>(t.data.data()) % alignof(float) != 0) {
      return InvalidArgumentError("GGUF '" + file.name() + "': f32 tensor " + std::string(t.name) +
                                  " is not 4-byte aligned");
    }
  }
  LlamaWeights w;
  w.token_embd = Matrix(file, "token_embd.weight");
  w.output_norm = Vector(file, "output_norm.weight");
  w.output = config.tied_output ? w.token_embd : Matrix(file, "output.weight");
  w.total_bytes = Bytes(w.token_embd) + (config.tied_output ? 0 : Bytes(w.output));
  // Decode reads one embedding row, every layer matrix and the output head.
  w.decode_bytes_per_token = static_cast<int64_t>(w.token_embd.row_bytes()) + Bytes(w.output);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    auto name = [l](std::string_view suffix) { return BlockTensorName(l, suffix); };
    LlamaLayerWeights& layer = w.layers.emplace_back();
    layer.attn_norm = Vector(file, name("attn_norm.weight"));
    layer.wq = Matrix(file, name("attn_q.weight"));
    layer.wk = Matrix(file, name("attn_k.weight"));
    layer.wv = Matrix(file, name("attn_v.weight"));
    layer.wo = Matrix(file, name("attn_output.weight"));
    layer.bq = OptionalVector(file, name("attn_q.bias"));
    layer.bk = OptionalVector(file, name("attn_k.bias"));
    layer.bv = OptionalVector(file, name("attn_v.bias"));
    layer.bo = OptionalVector(file, name("attn_output.bias"));
    layer.ffn_norm = Vector(file, name("ffn_norm.weight"));
    int64_t attn_bytes = Bytes(layer.wq) + Bytes(layer.wk) + Bytes(layer.wv) + Bytes(layer.wo);
    int64_t ffn_total = 0, ffn_read = 0;
    if (config.is_moe()) {
      layer.router = Matrix(file, name("ffn_gate_inp.weight"));
      layer.expert_gate = Experts(file, name("ffn_gate_exps.weight"));
      layer.expert_up = Experts(file, name("ffn_up_exps.weight"));
      layer.expert_down = Experts(file, name("ffn_down_exps.weight"));
      const int64_t per_expert =
          Bytes(layer.expert_gate[0]) + Bytes(layer.expert_up[0]) + Bytes(layer.expert_down[0]);
      ffn_total = Bytes(layer.router) + per_expert * config.num_experts;
      ffn_read = Bytes(layer.router) + per_expert * config.num_experts_used;
      if (config.shared_expert_ffn_dim > 0) {
        layer.shared_gate = Matrix(file, name("ffn_gate_inp_shexp.weight"));
        layer.shared_ffn_gate = Matrix(file, name("ffn_gate_shexp.weight"));
        layer.shared_ffn_up = Matrix(file, name("ffn_up_shexp.weight"));
        layer.shared_ffn_down = Matrix(file, name("ffn_down_shexp.weight"));
        const int64_t shared = Bytes(layer.shared_gate) + Bytes(layer.shared_ffn_gate) +
                               Bytes(layer.shared_ffn_up) + Bytes(layer.shared_ffn_down);
        ffn_total += shared;
        ffn_read += shared;
      }
    } else {
      layer.ffn_gate = Matrix(file, name("ffn_gate.weight"));
      layer.ffn_up = Matrix(file, name("ffn_up.weight"));
      layer.ffn_down = Matrix(file, name("ffn_down.weight"));
      ffn_total = ffn_read = Bytes(layer.ffn_gate) + Bytes(layer.ffn_up) + Bytes(layer.ffn_down);
    }
    w.total_bytes += attn_bytes + ffn_total;
    w.decode_bytes_per_token += attn_bytes + ffn_read;
  }
  return w;
}

}  // namespace tessera::model
