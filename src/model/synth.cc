#include "model/synth.h"

#include <cmath>
#include <cstdio>
#include <unordered_set>
#include <vector>

#include "kernels/quantize.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace tessera::model {
namespace {

using kernels::WeightType;

constexpr int64_t kDefaultSynthVocab = 512;
constexpr int64_t kMinSynthVocab = 300;  // 3 specials + 256 byte tokens + some pieces

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// llama.cpp's general.file_type for a model whose matrices are all `type`.
uint32_t FileType(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return 0;
    case WeightType::kF16:
      return 1;
    case WeightType::kQ4_0:
      return 2;
    case WeightType::kQ8_0:
      return 7;
    case WeightType::kQ4_K:
      return 14;  // LLAMA_FTYPE_MOSTLY_Q4_K_S (all-Q4_K; llama.cpp's own mix is _M)
    case WeightType::kQ6_K:
      return 18;
    case WeightType::kBF16:
      return 32;
    default:
      return 0;
  }
}

// A self-contained SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte
// tokens, then "▁", single characters and short letter strings (with and without
// the "▁" word prefix), scored so that earlier pieces merge first.
void SetSyntheticVocab(GgufWriter& writer, int64_t vocab_size) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
  }
  const std::string space = "\xE2\x96\x81";
  std::vector<std::string> pieces = {space};
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(space + c);
  for (int c = 33; c <= 126; ++c) pieces.push_back(std::string(1, static_cast<char>(c)));
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) {
      pieces.push_back(std::string{a, b});
      pieces.push_back(space + a + b);
    }
  }
  for (size_t i = 0; tokens.size() < static_cast<size_t>(vocab_size); ++i) {
    if (i < pieces.size()) {
      tokens.push_back(pieces[i]);
    } else {  // beyond the list: unique filler pieces
      tokens.push_back(space + "t" + std::to_string(i));
    }
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t i = 259; i < scores.size(); ++i) scores[i] = -static_cast<float>(i - 259);
  writer.SetString("tokenizer.ggml.model", "llama");
  writer.SetStringArray("tokenizer.ggml.tokens", tokens);
  writer.SetF32Array("tokenizer.ggml.scores", scores);
  writer.SetI32Array("tokenizer.ggml.token_type", types);
  writer.SetU32("tokenizer.ggml.bos_token_id", 1);
  writer.SetU32("tokenizer.ggml.eos_token_id", 2);
  writer.SetU32("tokenizer.ggml.unknown_token_id", 0);
  writer.SetBool("tokenizer.ggml.add_bos_token", true);
  writer.SetBool("tokenizer.ggml.add_eos_token", false);
}

Status CheckOptions(const SynthOptions& o) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("synth: " + m); };
  if (o.dim < 1 || o.num_layers < 1 || o.num_heads < 1 || o.ffn_dim < 1) {
    return bad("--dim, --layers, --heads and --ffn must be positive");
  }
  if (o.dim % o.num_heads != 0) {
    return bad("--dim " + std::to_string(o.dim) + " is not divisible by --heads " +
               std::to_string(o.num_heads));
  }
  if ((o.dim / o.num_heads) % 2 != 0) return bad("head size dim/heads must be even (RoPE)");
  int64_t kv = o.num_kv_heads ? o.num_kv_heads : o.num_heads;
  if (kv < 1 || o.num_heads % kv != 0) {
    return bad("--kv-heads " + std::to_string(kv) + " must divide --heads " +
               std::to_string(o.num_heads));
  }
  if (o.moe) {
    if (o.num_experts < 1 || o.num_experts_used < 1 || o.num_experts_used > o.num_experts) {
      return bad("--arch moe needs --experts >= 1 and 1 <= --experts-used <= --experts");
    }
  } else if (o.num_experts != 0 || o.num_experts_used != 0 || o.shared_expert_ffn_dim != 0) {
    return bad("--experts/--experts-used need --arch moe");
  }
  if (!kernels::CanQuantize(o.type)) {
    return bad("--type must be f32, f16, bf16, q8_0, q4_0, q4_k or q6_k");
  }
  int64_t block = kernels::TraitsOf(o.type).block_elems;
  if (o.dim % block != 0 || o.ffn_dim % block != 0) {
    return bad("--type " + std::string(kernels::TraitsOf(o.type).name) +
               " needs --dim and --ffn to be multiples of " + std::to_string(block));
  }
  if (o.context_length < 1) return bad("context length must be positive");
  if (o.damp_from > o.num_layers || o.damp < 0) {
    return bad("--damp-from must be at most --layers and --damp non-negative");
  }
  return Status::Ok();
}

// What to put in each tensor.
enum class Fill { kOnes, kUniform };

struct TensorPlan {
  std::string name;
  WeightType type;
  std::vector<int64_t> dims;
  Fill fill;
  float stddev;
  // Added to every value of rows [offset_first_row, + offset_rows) (-1: every row).
  float offset = 0;
  int64_t offset_rows = -1;
  int64_t offset_first_row = 0;
};

// Streams one tensor's values row by row through `buffer`s into the writer.
Status WriteTensor(GgufWriter& writer, const TensorPlan& t, uint64_t seed) {
  const int64_t row = t.dims[0];
  int64_t rows = 1;
  for (size_t i = 1; i < t.dims.size(); ++i) rows *= t.dims[i];
  const size_t row_bytes = static_cast<size_t>(*kernels::RowBytes(t.type, row));
  // Rows per chunk: about 1 MiB of output at a time.
  const int64_t chunk_rows = std::max<int64_t>(1, (1 << 20) / static_cast<int64_t>(row_bytes));
  std::vector<float> values(row);
  std::vector<uint8_t> out(static_cast<size_t>(chunk_rows) * row_bytes);
  uint64_t state = seed ^ Fnv1a(t.name);
  const float half_width = t.stddev * std::sqrt(3.0f);  // uniform [-a, a) has std a/sqrt(3)
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    int64_t n = std::min(chunk_rows, rows - r0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < row; ++i) {
        if (t.fill == Fill::kOnes) {
          values[i] = 1.0f;
        } else {
          float u = static_cast<float>(SplitMix64(&state) >> 40) * (1.0f / 16777216.0f);
          values[i] = (2.0f * u - 1.0f) * half_width;
        }
        const int64_t at = r0 + r - t.offset_first_row;
        if (t.offset != 0 && (t.offset_rows < 0 || (at >= 0 && at < t.offset_rows))) {
          values[i] += t.offset;
        }
      }
      kernels::QuantizeRow(t.type, values.data(), row, out.data() + r * row_bytes);
    }
    TESSERA_RETURN_IF_ERROR(writer.Append(std::span(out.data(), n * row_bytes)));
  }
  return Status::Ok();
}

}  // namespace

Status WriteSynthModel(const SynthOptions& o, const std::string& path) {
  TESSERA_RETURN_IF_ERROR(CheckOptions(o));
  const int64_t kv_heads = o.num_kv_heads ? o.num_kv_heads : o.num_heads;
  const int64_t head_dim = o.dim / o.num_heads;
  const int64_t kv_dim = kv_heads * head_dim;

  GgufWriter writer;
  const bool qwen2moe = o.moe && o.shared_expert_ffn_dim > 0;
  const std::string arch = qwen2moe ? "qwen2moe" : "llama";
  const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  writer.SetString("general.architecture", arch);
  int64_t vocab_size = o.vocab_size;
  if (!o.vocab_from.empty()) {
    TESSERA_ASSIGN_OR_RETURN(GgufFile source, GgufFile::Open(o.vocab_from));
    TESSERA_ASSIGN_OR_RETURN(std::span<const std::string_view> tokens,
                             source.GetStringArray("tokenizer.ggml.tokens"));
    int64_t n = static_cast<int64_t>(tokens.size());
    if (vocab_size != 0 && vocab_size != n) {
      return InvalidArgumentError("synth: --vocab " + std::to_string(vocab_size) + " but '" +
                                  o.vocab_from + "' has " + std::to_string(n) + " tokens");
    }
    vocab_size = n;
    for (const GgufKeyValue& kv : source.metadata()) {
      if (kv.key.starts_with("tokenizer.")) writer.SetValue(kv.key, kv.value);
    }
  } else {
    if (vocab_size == 0) vocab_size = kDefaultSynthVocab;
    if (vocab_size < kMinSynthVocab) {
      return InvalidArgumentError("synth: the synthetic vocabulary needs --vocab >= " +
                                  std::to_string(kMinSynthVocab));
    }
    SetSyntheticVocab(writer, vocab_size);
  }
  if (vocab_size > (int64_t{1} << 31)) return InvalidArgumentError("synth: vocabulary too large");

  std::string name = o.name;
  if (name.empty()) {
    name = "tessera-synth " +
           std::string(qwen2moe ? "qwen2moe"
                       : o.moe  ? "moe"
                                : "llama") +
           " dim" + std::to_string(o.dim) + " L" + std::to_string(o.num_layers) + " " +
           std::string(kernels::TraitsOf(o.type).name);
  }
  writer.SetString("general.name", name);
  writer.SetU32("general.file_type", FileType(o.type));
  writer.SetU32("general.quantization_version", 2);
  writer.SetU32(key("vocab_size"), static_cast<uint32_t>(vocab_size));
  writer.SetU32(key("context_length"), static_cast<uint32_t>(o.context_length));
  writer.SetU32(key("embedding_length"), static_cast<uint32_t>(o.dim));
  writer.SetU32(key("block_count"), static_cast<uint32_t>(o.num_layers));
  writer.SetU32(key("feed_forward_length"), static_cast<uint32_t>(o.ffn_dim));
  writer.SetU32(key("attention.head_count"), static_cast<uint32_t>(o.num_heads));
  writer.SetU32(key("attention.head_count_kv"), static_cast<uint32_t>(kv_heads));
  writer.SetU32(key("rope.dimension_count"), static_cast<uint32_t>(head_dim));
  writer.SetF32(key("rope.freq_base"), o.rope_theta);
  writer.SetF32(key("attention.layer_norm_rms_epsilon"), o.rms_eps);
  if (o.moe) {
    writer.SetU32(key("expert_count"), static_cast<uint32_t>(o.num_experts));
    writer.SetU32(key("expert_used_count"), static_cast<uint32_t>(o.num_experts_used));
    if (qwen2moe) {
      writer.SetU32(key("expert_feed_forward_length"), static_cast<uint32_t>(o.ffn_dim));
      writer.SetU32(key("expert_shared_feed_forward_length"),
                    static_cast<uint32_t>(o.shared_expert_ffn_dim));
    }
  }

  // The tensors, in llama.cpp's order.
  const WeightType m = o.type;
  auto inv_sqrt = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<TensorPlan> plan;
  // A skewed router (router_skew > 0): every embedding row shares a component along
  // (1, 1, …), which the residual stream carries through the layers, and the first
  // quarter of the experts' router rows lean the same way, so they win more often.
  const int64_t hot_experts = std::max<int64_t>(1, o.num_experts / 4);
  plan.push_back(
      {"token_embd.weight", m, {o.dim, vocab_size}, Fill::kUniform, 1.0f, o.router_skew * 0.5f});
  for (int64_t l = 0; l < o.num_layers; ++l) {
    auto n = [l](std::string_view s) { return BlockTensorName(l, s); };
    // What the block adds to the residual stream, damped from damp_from on.
    const float out = o.damp_from >= 0 && l >= o.damp_from ? o.damp : 1.0f;
    plan.push_back({n("attn_norm.weight"), WeightType::kF32, {o.dim}, Fill::kOnes, 0});
    plan.push_back({n("attn_q.weight"), m, {o.dim, o.dim}, Fill::kUniform, inv_sqrt(o.dim)});
    plan.push_back({n("attn_k.weight"), m, {o.dim, kv_dim}, Fill::kUniform, inv_sqrt(o.dim)});
    plan.push_back({n("attn_v.weight"), m, {o.dim, kv_dim}, Fill::kUniform, inv_sqrt(o.dim)});
    plan.push_back(
        {n("attn_output.weight"), m, {o.dim, o.dim}, Fill::kUniform, out * inv_sqrt(o.dim)});
    plan.push_back({n("ffn_norm.weight"), WeightType::kF32, {o.dim}, Fill::kOnes, 0});
    if (o.moe) {
      int64_t e = o.num_experts;
      plan.push_back(
          {n("ffn_gate_inp.weight"),
           WeightType::kF32,
           {o.dim, e},
           Fill::kUniform,
           inv_sqrt(o.dim),
           o.router_skew * inv_sqrt(o.dim),
           hot_experts,
           o.router_skew_by_layer ? hot_experts * (l % std::max<int64_t>(1, e / hot_experts)) : 0});
      plan.push_back(
          {n("ffn_gate_exps.weight"), m, {o.dim, o.ffn_dim, e}, Fill::kUniform, inv_sqrt(o.dim)});
      plan.push_back({n("ffn_down_exps.weight"),
                      m,
                      {o.ffn_dim, o.dim, e},
                      Fill::kUniform,
                      out * inv_sqrt(o.ffn_dim)});
      plan.push_back(
          {n("ffn_up_exps.weight"), m, {o.dim, o.ffn_dim, e}, Fill::kUniform, inv_sqrt(o.dim)});
      if (qwen2moe) {
        const int64_t f = o.shared_expert_ffn_dim;
        plan.push_back({n("ffn_gate_inp_shexp.weight"),
                        WeightType::kF32,
                        {o.dim},
                        Fill::kUniform,
                        inv_sqrt(o.dim)});
        plan.push_back(
            {n("ffn_gate_shexp.weight"), m, {o.dim, f}, Fill::kUniform, inv_sqrt(o.dim)});
        plan.push_back({n("ffn_up_shexp.weight"), m, {o.dim, f}, Fill::kUniform, inv_sqrt(o.dim)});
        plan.push_back(
            {n("ffn_down_shexp.weight"), m, {f, o.dim}, Fill::kUniform, out * inv_sqrt(f)});
      }
    } else {
      plan.push_back(
          {n("ffn_gate.weight"), m, {o.dim, o.ffn_dim}, Fill::kUniform, inv_sqrt(o.dim)});
      plan.push_back(
          {n("ffn_down.weight"), m, {o.ffn_dim, o.dim}, Fill::kUniform, out * inv_sqrt(o.ffn_dim)});
      plan.push_back({n("ffn_up.weight"), m, {o.dim, o.ffn_dim}, Fill::kUniform, inv_sqrt(o.dim)});
    }
  }
  plan.push_back({"output_norm.weight", WeightType::kF32, {o.dim}, Fill::kOnes, 0});
  if (!o.tied_output) {
    plan.push_back({"output.weight", m, {o.dim, vocab_size}, Fill::kUniform, inv_sqrt(o.dim)});
  }

  for (const TensorPlan& t : plan) {
    TESSERA_RETURN_IF_ERROR(writer.AddTensor(t.name, t.type, t.dims).WithContext("synth"));
  }
  TESSERA_RETURN_IF_ERROR(writer.Open(path));
  for (const TensorPlan& t : plan) {
    Status s = WriteTensor(writer, t, o.seed);
    if (!s.ok()) {
      (void)writer.Close();
      std::remove(path.c_str());
      return s;
    }
  }
  Status s = writer.Close();
  if (!s.ok()) std::remove(path.c_str());
  return s;
}

}  // namespace tessera::model
