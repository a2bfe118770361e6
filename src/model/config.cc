#include "model/config.h"

#include <cmath>

namespace tessera::model {

std::string_view RopeLayoutName(RopeLayout layout) {
  return layout == RopeLayout::kNeox ? "neox" : "normal";
}

std::string_view RopeScalingName(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::kNone:
      return "none";
    case RopeScaling::kLinear:
      return "linear";
    case RopeScaling::kYarn:
      return "yarn";
  }
  return "none";
}

std::string BlockTensorName(int64_t layer_idx, std::string_view suffix) {
  return "blk." + std::to_string(layer_idx) + "." + std::string(suffix);
}

namespace {

struct ArchInfo {
  std::string_view name;
  RopeLayout rope_layout;
  bool moe_shared_expert;  // may have a shared expert (qwen2moe)
};

constexpr ArchInfo kArchs[] = {
    {"llama", RopeLayout::kNormal, false},
    {"mistral", RopeLayout::kNormal, false},
    {"qwen2", RopeLayout::kNeox, false},
    {"qwen2moe", RopeLayout::kNeox, true},
};

// Reads "<arch>.<suffix>" keys and turns errors into messages naming the file.
class KeyReader {
 public:
  KeyReader(const GgufFile& file, std::string_view arch) : file_(file), prefix_(arch) {
    prefix_ += '.';
  }
  std::string Key(std::string_view suffix) const { return prefix_ + std::string(suffix); }

  Result<int64_t> Positive(std::string_view suffix) const {
    TESSERA_ASSIGN_OR_RETURN(int64_t value, file_.GetInt(Key(suffix)));
    return CheckPositive(suffix, value);
  }
  Result<int64_t> PositiveOr(std::string_view suffix, int64_t fallback) const {
    if (!file_.Has(Key(suffix))) return fallback;
    return Positive(suffix);
  }
  Result<int64_t> CheckPositive(std::string_view suffix, int64_t value) const {
    if (value <= 0 || value > (int64_t{1} << 40)) {
      return InvalidArgumentError("GGUF '" + file_.name() + "': " + Key(suffix) + " = " +
                                  std::to_string(value) + " is out of range");
    }
    return value;
  }
  Result<float> F32Or(std::string_view suffix, float fallback) const {
    return file_.GetF32Or(Key(suffix), fallback);
  }

 private:
  const GgufFile& file_;
  std::string prefix_;
};

Status Inconsistent(const GgufFile& file, const std::string& what) {
  return InvalidArgumentError("GGUF '" + file.name() + "': " + what);
}

}  // namespace

Result<ModelConfig> ModelConfigFromGguf(const GgufFile& file) {
  ModelConfig c;
  TESSERA_ASSIGN_OR_RETURN(std::string_view arch, file.GetString("general.architecture"));
  const ArchInfo* info = nullptr;
  for (const ArchInfo& a : kArchs) {
    if (a.name == arch) info = &a;
  }
  if (!info) {
    return InvalidArgumentError("GGUF '" + file.name() + "': architecture '" + std::string(arch) +
                                "' is not supported (llama, mistral, qwen2, qwen2moe are)");
  }
  c.arch = std::string(arch);
  TESSERA_ASSIGN_OR_RETURN(std::string_view name, file.GetStringOr("general.name", ""));
  c.name = std::string(name);
  KeyReader keys(file, arch);

  TESSERA_ASSIGN_OR_RETURN(c.dim, keys.Positive("embedding_length"));
  TESSERA_ASSIGN_OR_RETURN(c.num_layers, keys.Positive("block_count"));
  TESSERA_ASSIGN_OR_RETURN(c.context_length, keys.PositiveOr("context_length", 2048));
  TESSERA_ASSIGN_OR_RETURN(c.num_heads, keys.Positive("attention.head_count"));
  TESSERA_ASSIGN_OR_RETURN(c.num_kv_heads, keys.PositiveOr("attention.head_count_kv", c.num_heads));
  if (!file.Has(keys.Key("attention.key_length")) && c.dim % c.num_heads != 0) {
    return Inconsistent(file, "embedding_length " + std::to_string(c.dim) +
                                  " is not divisible by head_count " + std::to_string(c.num_heads));
  }
  TESSERA_ASSIGN_OR_RETURN(c.head_dim,
                           keys.PositiveOr("attention.key_length", c.dim / c.num_heads));
  TESSERA_ASSIGN_OR_RETURN(int64_t value_length,
                           keys.PositiveOr("attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return Inconsistent(file, "attention.value_length " + std::to_string(value_length) +
                                  " differs from key_length " + std::to_string(c.head_dim) +
                                  " (not supported)");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Inconsistent(file, "head_count " + std::to_string(c.num_heads) +
                                  " is not a multiple of head_count_kv " +
                                  std::to_string(c.num_kv_heads));
  }
  TESSERA_ASSIGN_OR_RETURN(float eps, keys.F32Or("attention.layer_norm_rms_epsilon", 1e-5f));
  if (!(eps > 0.0f && eps < 1.0f)) {
    return Inconsistent(file, "layer_norm_rms_epsilon " + std::to_string(eps) + " is out of range");
  }
  c.rms_eps = eps;

  // RoPE.
  TESSERA_ASSIGN_OR_RETURN(c.rope_theta, keys.F32Or("rope.freq_base", 10000.0f));
  if (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)) {
    return Inconsistent(file, "rope.freq_base " + std::to_string(c.rope_theta) + " is invalid");
  }
  TESSERA_ASSIGN_OR_RETURN(c.rope_dim, keys.PositiveOr("rope.dimension_count", c.head_dim));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return Inconsistent(file, "rope.dimension_count " + std::to_string(c.rope_dim) +
                                  " must be even and at most the head size " +
                                  std::to_string(c.head_dim));
  }
  c.rope_layout = info->rope_layout;
  TESSERA_ASSIGN_OR_RETURN(std::string_view scaling,
                           file.GetStringOr(keys.Key("rope.scaling.type"), ""));
  TESSERA_ASSIGN_OR_RETURN(float factor, keys.F32Or("rope.scaling.factor", 0.0f));
  if (factor == 0.0f) {
    // Older files state linear scaling as rope.scale_linear.
    TESSERA_ASSIGN_OR_RETURN(factor, keys.F32Or("rope.scale_linear", 0.0f));
    if (factor != 0.0f && scaling.empty()) scaling = "linear";
  }
  if (scaling.empty() || scaling == "none") {
    c.rope_scaling = RopeScaling::kNone;
  } else if (scaling == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
  } else if (scaling == "yarn") {
    c.rope_scaling = RopeScaling::kYarn;
    c.rope_yarn_ext_factor = 1.0f;
  } else {
    return InvalidArgumentError("GGUF '" + file.name() + "': rope.scaling.type '" +
                                std::string(scaling) + "' is not supported (none, linear, yarn)");
  }
  if (c.rope_scaling != RopeScaling::kNone) {
    if (!(factor > 0.0f) || !std::isfinite(factor)) {
      return Inconsistent(file, "rope scaling '" + std::string(scaling) + "' needs a positive " +
                                    keys.Key("rope.scaling.factor"));
    }
    c.rope_scaling_factor = factor;
  }
  TESSERA_ASSIGN_OR_RETURN(
      c.rope_original_context,
      keys.PositiveOr("rope.scaling.original_context_length", c.context_length));
  TESSERA_ASSIGN_OR_RETURN(c.rope_yarn_beta_fast, keys.F32Or("rope.scaling.yarn_beta_fast", 32.0f));
  TESSERA_ASSIGN_OR_RETURN(c.rope_yarn_beta_slow, keys.F32Or("rope.scaling.yarn_beta_slow", 1.0f));
  TESSERA_ASSIGN_OR_RETURN(c.rope_yarn_attn_factor, keys.F32Or("rope.scaling.attn_factor", 1.0f));

  // Experts.
  TESSERA_ASSIGN_OR_RETURN(int64_t experts, file.GetIntOr(keys.Key("expert_count"), 0));
  if (experts < 0 || experts > 4096) {
    return Inconsistent(file, "expert_count " + std::to_string(experts) + " is out of range");
  }
  c.num_experts = experts;
  if (c.num_experts > 0) {
    TESSERA_ASSIGN_OR_RETURN(c.num_experts_used, keys.Positive("expert_used_count"));
    if (c.num_experts_used > c.num_experts) {
      return Inconsistent(file, "expert_used_count " + std::to_string(c.num_experts_used) +
                                    " exceeds expert_count " + std::to_string(c.num_experts));
    }
  } else if (info->moe_shared_expert) {
    return Inconsistent(file, "architecture " + c.arch + " needs " + keys.Key("expert_count"));
  }
  bool needs_dense_ffn = c.num_experts == 0;
  if (needs_dense_ffn || file.Has(keys.Key("feed_forward_length"))) {
    TESSERA_ASSIGN_OR_RETURN(c.ffn_dim, keys.Positive("feed_forward_length"));
  }
  if (c.is_moe()) {
    TESSERA_ASSIGN_OR_RETURN(c.expert_ffn_dim,
                             keys.PositiveOr("expert_feed_forward_length", c.ffn_dim));
    if (c.expert_ffn_dim == 0) {
      return Inconsistent(file,
                          "MoE model without feed_forward_length or "
                          "expert_feed_forward_length");
    }
    if (info->moe_shared_expert) {
      TESSERA_ASSIGN_OR_RETURN(c.shared_expert_ffn_dim,
                               file.GetIntOr(keys.Key("expert_shared_feed_forward_length"), 0));
      if (c.shared_expert_ffn_dim < 0) {
        return Inconsistent(file, "expert_shared_feed_forward_length is negative");
      }
    }
  }

  // Facts from the tensors.
  const GgufTensor* embd = file.FindTensor("token_embd.weight");
  if (!embd) {
    return InvalidArgumentError("GGUF '" + file.name() + "': tensor token_embd.weight is missing");
  }
  if (embd->dims.size() != 2) {
    return InvalidArgumentError("GGUF '" + file.name() + "': token_embd.weight has shape " +
                                embd->ShapeString() + ", expected [" + std::to_string(c.dim) +
                                ", vocab]");
  }
  c.vocab_size = embd->dims[1];
  if (file.Has(keys.Key("vocab_size"))) {
    TESSERA_ASSIGN_OR_RETURN(int64_t declared, keys.Positive("vocab_size"));
    if (declared != c.vocab_size) {
      return Inconsistent(file, keys.Key("vocab_size") + " = " + std::to_string(declared) +
                                    " but token_embd.weight has " + std::to_string(c.vocab_size) +
                                    " rows");
    }
  }
  c.tied_output = file.FindTensor("output.weight") == nullptr;
  c.rope_freq_factors = file.FindTensor("rope_freqs.weight") != nullptr;
  c.attn_qkv_bias = file.FindTensor(BlockTensorName(0, "attn_q.bias")) != nullptr;
  c.attn_output_bias = file.FindTensor(BlockTensorName(0, "attn_output.bias")) != nullptr;
  return c;
}

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  auto matrix = [&](std::string name, std::vector<int64_t> dims) {
    out.push_back({std::move(name), std::move(dims), true});
  };
  auto vector = [&](std::string name, int64_t size) {
    out.push_back({std::move(name), {size}, false});
  };
  matrix("token_embd.weight", {c.dim, c.vocab_size});
  if (c.rope_freq_factors) vector("rope_freqs.weight", c.rope_dim / 2);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto n = [l](std::string_view suffix) { return BlockTensorName(l, suffix); };
    vector(n("attn_norm.weight"), c.dim);
    matrix(n("attn_q.weight"), {c.dim, c.q_dim()});
    matrix(n("attn_k.weight"), {c.dim, c.kv_dim()});
    matrix(n("attn_v.weight"), {c.dim, c.kv_dim()});
    matrix(n("attn_output.weight"), {c.q_dim(), c.dim});
    if (c.attn_qkv_bias) {
      vector(n("attn_q.bias"), c.q_dim());
      vector(n("attn_k.bias"), c.kv_dim());
      vector(n("attn_v.bias"), c.kv_dim());
    }
    if (c.attn_output_bias) vector(n("attn_output.bias"), c.dim);
    vector(n("ffn_norm.weight"), c.dim);
    if (c.is_moe()) {
      matrix(n("ffn_gate_inp.weight"), {c.dim, c.num_experts});
      matrix(n("ffn_gate_exps.weight"), {c.dim, c.expert_ffn_dim, c.num_experts});
      matrix(n("ffn_up_exps.weight"), {c.dim, c.expert_ffn_dim, c.num_experts});
      matrix(n("ffn_down_exps.weight"), {c.expert_ffn_dim, c.dim, c.num_experts});
      if (c.shared_expert_ffn_dim > 0) {
        matrix(n("ffn_gate_inp_shexp.weight"), {c.dim});
        matrix(n("ffn_gate_shexp.weight"), {c.dim, c.shared_expert_ffn_dim});
        matrix(n("ffn_up_shexp.weight"), {c.dim, c.shared_expert_ffn_dim});
        matrix(n("ffn_down_shexp.weight"), {c.shared_expert_ffn_dim, c.dim});
      }
    } else {
      matrix(n("ffn_gate.weight"), {c.dim, c.ffn_dim});
      matrix(n("ffn_up.weight"), {c.dim, c.ffn_dim});
      matrix(n("ffn_down.weight"), {c.ffn_dim, c.dim});
    }
  }
  vector("output_norm.weight", c.dim);
  if (!c.tied_output) matrix("output.weight", {c.dim, c.vocab_size});
  return out;
}

namespace {
std::string Shape(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}
}  // namespace

Status ValidateModelTensors(const GgufFile& file, const ModelConfig& config) {
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    const GgufTensor* t = file.FindTensor(e.name);
    if (!t) {
      if (config.is_moe() && e.name.find("_exps.") != std::string::npos &&
          file.FindTensor(BlockTensorName(0, "ffn_gate.0.weight"))) {
        return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + e.name +
                                    " is missing; per-expert tensors (old Mixtral layout) are "
                                    "not supported, re-convert the model");
      }
      return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + e.name +
                                  " is missing (expected shape " + Shape(e.dims) + ")");
    }
    if (t->dims != e.dims) {
      return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + e.name + " has shape " +
                                  t->ShapeString() + ", expected " + Shape(e.dims));
    }
    // Norms and biases: f32; f16/bf16 (as Hugging Face checkpoints store them) are
    // widened to f32 when bound.
    if (!e.is_matrix && t->type != kernels::WeightType::kF32 &&
        t->type != kernels::WeightType::kF16 && t->type != kernels::WeightType::kBF16) {
      return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + e.name + " has type " +
                                  std::string(kernels::TraitsOf(t->type).name) +
                                  ", expected f32, f16 or bf16 (norms and biases)");
    }
  }
  return Status::Ok();
}

}  // namespace tessera::model
