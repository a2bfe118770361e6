#include "model/hf_checkpoint.h"

#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/half.h"
#include "model/config.h"
#include "model/gguf_writer.h"
#include "model/hf_tokenizer.h"
#include "model/safetensors.h"

namespace tessera::model {
namespace {

using kernels::WeightType;
using nlohmann::json;
using nlohmann::ordered_json;

// Largest JSON file read (a 150k-token tokenizer.json is about 10 MB).
constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t{512} << 20;

struct NamePair {
  std::string_view gguf;
  std::string_view hf;
};

// Names outside the layers.
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// A layer's names, after "blk.N." / "model.layers.N.".
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},
};

// Mixtral's experts: GGUF stacks them into one 3-D tensor, HF stores
// "block_sparse_moe.experts.E.<hf>.weight" each.
constexpr NamePair kExpertNames[] = {
    {"ffn_gate_exps.weight", "w1"},
    {"ffn_down_exps.weight", "w2"},
    {"ffn_up_exps.weight", "w3"},
};
constexpr std::string_view kExpertPrefix = "block_sparse_moe.experts.";

Result<json> ReadJson(const std::string& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (!required) return json();
    return NotFoundError("'" + path + "' is missing");
  }
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxJsonBytes) {
    return InvalidArgumentError("'" + path + "' cannot be read or is larger than " +
                                std::to_string(kMaxJsonBytes >> 20) + " MiB");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return InvalidArgumentError("reading '" + path + "' failed");
  try {
    return json::parse(text.str());
  } catch (const json::parse_error& e) {
    return InvalidArgumentError("'" + path + "' is not valid JSON (at byte " +
                                std::to_string(e.byte) + "): " + e.what());
  }
}

std::optional<WeightType> TypeOfDtype(std::string_view dtype) {
  if (dtype == "F32") return WeightType::kF32;
  if (dtype == "F16") return WeightType::kF16;
  if (dtype == "BF16") return WeightType::kBF16;
  return std::nullopt;
}

std::string_view DtypeOfType(WeightType type) {
  return type == WeightType::kF32 ? "F32" : type == WeightType::kF16 ? "F16" : "BF16";
}

// Reads config.json values, each error naming the file and key.
class ConfigReader {
 public:
  ConfigReader(const json& config, std::string path) : c_(config), path_(std::move(path)) {}

  bool Has(const char* key) const {
    return c_.is_object() && c_.contains(key) && !c_[key].is_null();
  }
  Result<int64_t> Int(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Error(std::string(key) + " is missing");
    }
    const json& v = c_[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 ||
        v.get<uint64_t>() > (uint64_t{1} << 40)) {
      return Error(std::string(key) + " = " + v.dump() + " is not a positive integer");
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  Result<double> Number(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    const json& v = c_[key];
    if (!v.is_number()) return Error(std::string(key) + " = " + v.dump() + " is not a number");
    return v.get<double>();
  }
  Result<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& v = c_[key];
    if (!v.is_boolean()) return Error(std::string(key) + " = " + v.dump() + " is not a boolean");
    return v.get<bool>();
  }
  Status Error(const std::string& what) const {
    return InvalidArgumentError("'" + path_ + "': " + what);
  }

 private:
  const json& c_;
  std::string path_;
};

// The safetensors files of a checkpoint, opened, with every tensor by name.
struct Weights {
  std::vector<SafetensorsFile> files;
  std::map<std::string, const SafetensorsTensor*> by_name;
};

Result<Weights> OpenWeights(const std::string& dir) {
  Weights w;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  std::vector<std::string> names;
  json weight_map;
  if (std::filesystem::exists(index_path, ec)) {
    TESSERA_ASSIGN_OR_RETURN(json index, ReadJson(index_path, true));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return InvalidArgumentError("'" + index_path + "' has no weight_map object");
    }
    weight_map = index["weight_map"];
    std::set<std::string> unique;
    for (const auto& [tensor, file] : weight_map.items()) {
      if (!file.is_string()) {
        return InvalidArgumentError("'" + index_path + "': tensor '" + tensor + "' maps to " +
                                    file.dump() + ", not a file name");
      }
      const std::string f = file.get<std::string>();
      // A name inside the checkpoint directory, nothing else.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
          !f.ends_with(".safetensors")) {
        return InvalidArgumentError("'" + index_path + "': tensor '" + tensor + "' maps to '" + f +
                                    "', not a .safetensors file in the checkpoint directory");
      }
      unique.insert(f);
    }
    names.assign(unique.begin(), unique.end());
  } else if (std::filesystem::exists(dir + "/model.safetensors", ec)) {
    names.push_back("model.safetensors");
  } else {
    return NotFoundError("'" + dir +
                         "' holds neither model.safetensors nor model.safetensors.index.json "
                         "(a Hugging Face checkpoint directory needs its weights)");
  }
  w.files.reserve(names.size());
  for (const std::string& name : names) {
    TESSERA_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(dir + "/" + name));
    w.files.push_back(std::move(f));
  }
  for (size_t i = 0; i < w.files.size(); ++i) {
    for (const SafetensorsTensor& t : w.files[i].tensors()) {
      if (!weight_map.is_null()) {
        const auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->get<std::string>() != names[i]) {
          return InvalidArgumentError(
              "'" + w.files[i].name() + "' holds tensor '" + t.name +
              "', which model.safetensors.index.json " +
              (it == weight_map.end() ? "does not list" : "puts in " + it->dump()));
        }
      }
      if (!w.by_name.emplace(t.name, &t).second) {
        return InvalidArgumentError("'" + dir + "': tensor '" + t.name + "' is in two files");
      }
    }
  }
  if (!weight_map.is_null()) {
    for (const auto& [tensor, file] : weight_map.items()) {
      if (!w.by_name.contains(tensor)) {
        return InvalidArgumentError("model.safetensors.index.json lists tensor '" + tensor +
                                    "' in '" + file.get<std::string>() + "', which lacks it");
      }
    }
  }
  return w;
}

// "model.layers.12.mlp.up_proj.weight" -> 12, "mlp.up_proj.weight".
bool SplitLayerName(std::string_view name, int64_t* layer, std::string_view* suffix) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return false;
  name.remove_prefix(kPrefix.size());
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), *layer);
  if (ec != std::errc() || end == name.data() || end == name.data() + name.size() || *end != '.') {
    return false;
  }
  *suffix = name.substr(static_cast<size_t>(end - name.data()) + 1);
  return true;
}

}  // namespace

bool IsCheckpointDirectory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

Result<GgufFile> OpenModelFile(const std::string& path) {
  if (IsCheckpointDirectory(path)) return OpenHfCheckpoint(path);
  return GgufFile::Open(path);
}

Result<GgufFile> OpenHfCheckpoint(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  std::error_code exists_error;
  if (!std::filesystem::exists(config_path, exists_error)) {
    return NotFoundError("'" + dir +
                         "' is a directory but not a Hugging Face checkpoint: config.json is "
                         "missing (tessera takes a GGUF file or a checkpoint directory)");
  }
  TESSERA_ASSIGN_OR_RETURN(json config, ReadJson(config_path, true));
  if (!config.is_object()) return InvalidArgumentError("'" + config_path + "' is not an object");
  ConfigReader c(config, config_path);
  const std::string model_type = config.contains("model_type") && config["model_type"].is_string()
                                     ? config["model_type"].get<std::string>()
                                     : "";
  std::string arch;
  bool rope_halves = true;  // llama layout: HF's q/k rows are permuted against GGUF's
  if (model_type == "llama" || model_type == "mistral" || model_type == "mixtral") {
    arch = "llama";
  } else if (model_type == "qwen2") {
    arch = "qwen2";
    rope_halves = false;  // neox RoPE in both formats
  } else {
    return c.Error("model_type '" + model_type +
                   "' is not supported (llama, mistral, mixtral, qwen2 are)");
  }
  if (c.Has("hidden_act") && config["hidden_act"] != "silu") {
    return c.Error("hidden_act " + config["hidden_act"].dump() + " is not supported (silu is)");
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t dim, c.Int("hidden_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t layers, c.Int("num_hidden_layers"));
  TESSERA_ASSIGN_OR_RETURN(int64_t heads, c.Int("num_attention_heads"));
  TESSERA_ASSIGN_OR_RETURN(int64_t kv_heads, c.Int("num_key_value_heads", heads));
  TESSERA_ASSIGN_OR_RETURN(int64_t ffn, c.Int("intermediate_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t context, c.Int("max_position_embeddings", 2048));
  if (dim % heads != 0 && !c.Has("head_dim")) {
    return c.Error("hidden_size " + std::to_string(dim) +
                   " is not divisible by num_attention_heads " + std::to_string(heads));
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t head_dim, c.Int("head_dim", dim / heads));
  TESSERA_ASSIGN_OR_RETURN(double eps, c.Number("rms_norm_eps", 1e-6));
  TESSERA_ASSIGN_OR_RETURN(double theta, c.Number("rope_theta", 10000.0));
  TESSERA_ASSIGN_OR_RETURN(bool tied, c.Bool("tie_word_embeddings", false));
  TESSERA_ASSIGN_OR_RETURN(double partial_rotary, c.Number("partial_rotary_factor", 1.0));
  if (partial_rotary != 1.0) return c.Error("partial_rotary_factor other than 1 is not supported");
  int64_t experts = 0, experts_used = 0;
  if (model_type == "mixtral") {
    TESSERA_ASSIGN_OR_RETURN(experts, c.Int("num_local_experts"));
    TESSERA_ASSIGN_OR_RETURN(experts_used, c.Int("num_experts_per_tok"));
  }
  if (head_dim % 2 != 0) return c.Error("head_dim " + std::to_string(head_dim) + " is odd");

  GgufWriter meta;
  const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  meta.SetString("general.architecture", arch);
  std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (name.empty())
    name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  meta.SetString("general.name", name);
  meta.SetU32(key("context_length"), static_cast<uint32_t>(context));
  meta.SetU32(key("embedding_length"), static_cast<uint32_t>(dim));
  meta.SetU32(key("block_count"), static_cast<uint32_t>(layers));
  meta.SetU32(key("feed_forward_length"), static_cast<uint32_t>(ffn));
  meta.SetU32(key("attention.head_count"), static_cast<uint32_t>(heads));
  meta.SetU32(key("attention.head_count_kv"), static_cast<uint32_t>(kv_heads));
  meta.SetU32(key("attention.key_length"), static_cast<uint32_t>(head_dim));
  meta.SetU32(key("attention.value_length"), static_cast<uint32_t>(head_dim));
  meta.SetU32(key("rope.dimension_count"), static_cast<uint32_t>(head_dim));
  meta.SetF32(key("rope.freq_base"), static_cast<float>(theta));
  meta.SetF32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(eps));
  if (experts > 0) {
    meta.SetU32(key("expert_count"), static_cast<uint32_t>(experts));
    meta.SetU32(key("expert_used_count"), static_cast<uint32_t>(experts_used));
  }
  if (c.Has("rope_scaling")) {
    const json& s = config["rope_scaling"];
    const json& type = s.contains("rope_type") ? s["rope_type"]
                       : s.contains("type")    ? s["type"]
                                               : json();
    const std::string t = type.is_string() ? type.get<std::string>() : "";
    if (t == "linear" || t == "yarn") {
      if (!s.contains("factor") || !s["factor"].is_number() || !(s["factor"].get<double>() > 0)) {
        return c.Error("rope_scaling " + s.dump() + " needs a positive factor");
      }
      meta.SetString(key("rope.scaling.type"), t);
      meta.SetF32(key("rope.scaling.factor"), s["factor"].get<float>());
      if (t == "yarn" && s.contains("original_max_position_embeddings") &&
          s["original_max_position_embeddings"].is_number_unsigned()) {
        meta.SetU32(key("rope.scaling.original_context_length"),
                    s["original_max_position_embeddings"].get<uint32_t>());
      }
    } else if (t != "default") {
      return c.Error("rope_scaling " + s.dump() + " is not supported (linear, yarn are)");
    }
  }

  // The weights, under their GGUF names.
  TESSERA_ASSIGN_OR_RETURN(Weights weights, OpenWeights(dir));
  std::vector<AssembledTensor> tensors;
  // Expert tensors by (layer, GGUF name): one per expert, stacked below.
  std::map<std::pair<int64_t, std::string_view>, std::vector<const SafetensorsTensor*>>
      expert_parts;
  auto convert = [&](const SafetensorsTensor& t, std::string gguf_name) -> Result<AssembledTensor> {
    const std::optional<WeightType> type = TypeOfDtype(t.dtype);
    if (!type) {
      return InvalidArgumentError("'" + dir + "': tensor '" + t.name + "' has dtype " + t.dtype +
                                  " (tessera reads F32, F16 and BF16 checkpoints)");
    }
    if (t.shape.empty() || t.shape.size() > 2 ||
        std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
      return InvalidArgumentError("'" + dir + "': tensor '" + t.name +
                                  "' has an empty or more than 2-D shape");
    }
    AssembledTensor a;
    a.name = std::move(gguf_name);
    a.type = *type;
    a.dims.assign(t.shape.rbegin(), t.shape.rend());
    a.data = t.data;
    return a;
  };
  for (const auto& [hf_name, t] : weights.by_name) {
    if (hf_name.ends_with("rotary_emb.inv_freq")) continue;  // recomputed, not a weight
    std::string gguf_name;
    for (const NamePair& p : kGlobalNames) {
      if (p.hf == hf_name) gguf_name = p.gguf;
    }
    int64_t layer = -1;
    std::string_view suffix;
    if (gguf_name.empty() && SplitLayerName(hf_name, &layer, &suffix)) {
      if (layer >= layers) {
        return InvalidArgumentError("'" + dir + "': tensor '" + hf_name + "' is past the " +
                                    std::to_string(layers) + " layers config.json declares");
      }
      for (const NamePair& p : kLayerNames) {
        if (p.hf == suffix) gguf_name = BlockTensorName(layer, p.gguf);
      }
      if (gguf_name.empty() && experts > 0 && suffix.starts_with(kExpertPrefix)) {
        std::string_view rest = suffix.substr(kExpertPrefix.size());
        int64_t e = -1;
        const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), e);
        rest.remove_prefix(static_cast<size_t>(end - rest.data()));
        for (const NamePair& p : kExpertNames) {
          if (ec == std::errc() && e >= 0 && e < experts &&
              rest == "." + std::string(p.hf) + ".weight") {
            auto& parts = expert_parts[{layer, p.gguf}];
            parts.resize(static_cast<size_t>(experts), nullptr);
            parts[static_cast<size_t>(e)] = t;
            gguf_name = "-";  // placed below
          }
        }
      }
    }
    if (gguf_name.empty()) {
      return InvalidArgumentError("'" + dir + "': tensor '" + hf_name +
                                  "' is not one tessera knows for " + model_type +
                                  " (see docs/checkpoints.md for the names)");
    }
    if (gguf_name == "-") continue;
    TESSERA_ASSIGN_OR_RETURN(AssembledTensor a, convert(*t, gguf_name));
    if (rope_halves &&
        (suffix == "self_attn.q_proj.weight" || suffix == "self_attn.k_proj.weight")) {
      a.rope_halves_head = head_dim;
    }
    if (rope_halves && (suffix == "self_attn.q_proj.bias" || suffix == "self_attn.k_proj.bias")) {
      return InvalidArgumentError("'" + dir + "': tensor '" + hf_name +
                                  "': query/key biases on a llama-layout model are not supported");
    }
    tensors.push_back(std::move(a));
  }
  // Mixtral experts: one 3-D view each, which needs them back to back in one file.
  for (const auto& [where, parts] : expert_parts) {
    const std::string gguf_name = BlockTensorName(where.first, where.second);
    for (size_t e = 0; e < parts.size(); ++e) {
      if (parts[e] == nullptr) {
        return InvalidArgumentError("'" + dir + "': expert " + std::to_string(e) + " of " +
                                    gguf_name + " is missing");
      }
      const bool contiguous =
          e == 0 ||
          (parts[e]->dtype == parts[0]->dtype && parts[e]->shape == parts[0]->shape &&
           parts[e]->data.data() == parts[e - 1]->data.data() + parts[e - 1]->data.size());
      if (!contiguous) {
        return InvalidArgumentError(
            "'" + dir + "': the experts of " + gguf_name +
            " are not stored back to back in one "
            "file in expert order (expert " +
            std::to_string(e) + "); tessera views them as one tensor and cannot read this layout");
      }
    }
    TESSERA_ASSIGN_OR_RETURN(AssembledTensor a, convert(*parts[0], gguf_name));
    a.dims.push_back(static_cast<int64_t>(parts.size()));
    a.data = {parts.front()->data.data(),
              static_cast<size_t>(parts.back()->data.data() + parts.back()->data.size() -
                                  parts.front()->data.data())};
    tensors.push_back(std::move(a));
  }
  const auto has = [&tensors](std::string_view n) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [n](const AssembledTensor& a) { return a.name == n; });
  };
  if (has("output.weight") == false && !tied) {
    return InvalidArgumentError("'" + dir +
                                "': lm_head.weight is missing and config.json does not "
                                "set tie_word_embeddings");
  }
  const auto embd = std::find_if(tensors.begin(), tensors.end(), [](const AssembledTensor& a) {
    return a.name == "token_embd.weight";
  });
  if (embd == tensors.end() || embd->dims.size() != 2) {
    return InvalidArgumentError("'" + dir + "': model.embed_tokens.weight is missing or not 2-D");
  }
  const int64_t vocab_rows = embd->dims[1];
  if (c.Has("vocab_size")) {
    TESSERA_ASSIGN_OR_RETURN(int64_t declared, c.Int("vocab_size"));
    meta.SetU32(key("vocab_size"), static_cast<uint32_t>(declared));
  }

  // The tokenizer and chat template.
  TESSERA_ASSIGN_OR_RETURN(json tokenizer, ReadJson(dir + "/tokenizer.json", true));
  TESSERA_ASSIGN_OR_RETURN(json tokenizer_config, ReadJson(dir + "/tokenizer_config.json", false));
  if (!tokenizer_config.is_null() && !tokenizer_config.is_object()) {
    return InvalidArgumentError("'" + dir + "/tokenizer_config.json' is not an object");
  }
  std::error_code ec;
  if ((tokenizer_config.is_null() || !tokenizer_config.contains("chat_template")) &&
      std::filesystem::exists(dir + "/chat_template.jinja", ec)) {
    std::ifstream in(dir + "/chat_template.jinja", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    tokenizer_config["chat_template"] = text.str();
  }
  TESSERA_RETURN_IF_ERROR(HfTokenizerToGguf(tokenizer, tokenizer_config, config, vocab_rows,
                                            dir + "/tokenizer.json", meta));

  std::vector<std::unique_ptr<MappedFile>> mappings;
  for (SafetensorsFile& f : weights.files) mappings.push_back(f.TakeMapping());
  Result<GgufFile> file =
      GgufFile::Assemble(dir, meta.MetadataImage(), std::move(mappings), std::move(tensors));
  tokenizer = json();
  tokenizer_config = json();
  // The parsed tokenizer.json took ~20 MB of heap for a 32k vocabulary (nodes of its
  // vocab map and merges): hand it back rather than keep it resident under the weights.
  ::malloc_trim(0);
  return file;
}

// ---------------------------------------------------------------- export

namespace {

float LoadValue(WeightType type, const uint8_t* p) {
  if (type == WeightType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return type == WeightType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
}

void StoreValue(WeightType type, float f, std::string* out) {
  if (type == WeightType::kF32) {
    out->append(reinterpret_cast<const char*>(&f), 4);
    return;
  }
  const uint16_t h = type == WeightType::kF16 ? F32ToF16(f) : F32ToBf16(f);
  out->append(reinterpret_cast<const char*>(&h), 2);
}

// Rows [0, rows) of `bytes` (each `row_bytes`), type `from`, appended as type `to`;
// with `head` > 0, reordered from GGUF's RoPE pairs to HF's rotate-half order.
void AppendRows(std::span<const uint8_t> bytes, int64_t rows, WeightType from, WeightType to,
                int64_t head, std::string* out) {
  const size_t row_bytes = bytes.size() / static_cast<size_t>(rows);
  const size_t width = row_bytes / static_cast<size_t>(kernels::TraitsOf(from).block_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t src = r;
    if (head > 0) {  // HF row h0 + j*head/2 + i is GGUF row h0 + 2i + j
      const int64_t h0 = r / head * head, k = r % head;
      src = h0 + 2 * (k % (head / 2)) + k / (head / 2);
    }
    const uint8_t* row = bytes.data() + static_cast<size_t>(src) * row_bytes;
    if (from == to) {
      out->append(reinterpret_cast<const char*>(row), row_bytes);
      continue;
    }
    const size_t element = static_cast<size_t>(kernels::TraitsOf(from).block_bytes);
    for (size_t i = 0; i < width; ++i) StoreValue(to, LoadValue(from, row + i * element), out);
  }
}

}  // namespace

Status ExportHfCheckpoint(const GgufFile& file, const std::string& dir,
                          const HfExportOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig c, ModelConfigFromGguf(file));
  TESSERA_RETURN_IF_ERROR(ValidateModelTensors(file, c));
  const bool llama = c.arch == "llama" || c.arch == "mistral";
  if (!llama && !(c.arch == "qwen2")) {
    return InvalidArgumentError("GGUF '" + file.name() + "': architecture " + c.arch +
                                " cannot be exported as a Hugging Face checkpoint (llama, "
                                "mistral, qwen2 and llama MoE can)");
  }
  if (options.dtype && *options.dtype != WeightType::kF32 && *options.dtype != WeightType::kF16 &&
      *options.dtype != WeightType::kBF16) {
    return InvalidArgumentError("a checkpoint's dtype is f32, f16 or bf16");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgumentError("cannot create '" + dir + "': " + ec.message());

  std::vector<SafetensorsEntry> entries;
  std::vector<int64_t> entry_bytes;
  for (const GgufTensor& t : file.tensors()) {
    if (t.type != WeightType::kF32 && t.type != WeightType::kF16 && t.type != WeightType::kBF16) {
      return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + std::string(t.name) +
                                  " is " + std::string(kernels::TraitsOf(t.type).name) +
                                  "; a checkpoint holds f32, f16 or bf16 only");
    }
    const WeightType to = options.dtype.value_or(t.type);
    std::string hf_name;
    for (const NamePair& p : kGlobalNames) {
      if (p.gguf == t.name) hf_name = p.hf;
    }
    int64_t layer = -1;
    std::string_view suffix;
    if (hf_name.empty() && t.name.starts_with("blk.")) {
      const std::string_view rest = t.name.substr(4);
      const auto [end, err] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
      if (err == std::errc() && end < rest.data() + rest.size() && *end == '.') {
        suffix = rest.substr(static_cast<size_t>(end - rest.data()) + 1);
      }
    }
    const std::string layer_prefix = "model.layers." + std::to_string(layer) + ".";
    for (const NamePair& p : kLayerNames) {
      if (!suffix.empty() && p.gguf == suffix) hf_name = layer_prefix + std::string(p.hf);
    }
    const int64_t rows = t.num_elements / t.dims[0];
    const int64_t head =
        llama && (suffix == "attn_q.weight" || suffix == "attn_k.weight") ? c.head_dim : 0;
    const int element = SafetensorsDtypeBytes(DtypeOfType(to));
    bool expert = false;
    for (const NamePair& p : kExpertNames) {
      if (suffix.empty() || p.gguf != suffix) continue;
      expert = true;
      const int64_t n = t.dims[2], expert_rows = t.dims[1];
      const size_t slab = t.data.size() / static_cast<size_t>(n);
      for (int64_t e = 0; e < n; ++e) {
        const std::span<const uint8_t> bytes = t.data.subspan(static_cast<size_t>(e) * slab, slab);
        entries.push_back({layer_prefix + std::string(kExpertPrefix) + std::to_string(e) + "." +
                               std::string(p.hf) + ".weight",
                           std::string(DtypeOfType(to)),
                           {expert_rows, t.dims[0]},
                           [bytes, expert_rows, from = t.type, to](std::string* out) {
                             AppendRows(bytes, expert_rows, from, to, 0, out);
                             return Status::Ok();
                           }});
        entry_bytes.push_back(expert_rows * t.dims[0] * element);
      }
    }
    if (expert) continue;
    if (hf_name.empty()) {
      return InvalidArgumentError("GGUF '" + file.name() + "': tensor " + std::string(t.name) +
                                  " has no Hugging Face name tessera knows");
    }
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    entries.push_back({hf_name, std::string(DtypeOfType(to)), shape,
                       [bytes = t.data, rows, from = t.type, to, head](std::string* out) {
                         AppendRows(bytes, rows, from, to, head, out);
                         return Status::Ok();
                       }});
    entry_bytes.push_back(t.num_elements * element);
  }

  // Files: one, or shards of at most max_shard_bytes (at least a tensor each).
  std::vector<std::vector<size_t>> groups(1);
  int64_t group_bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (options.max_shard_bytes > 0 && !groups.back().empty() &&
        group_bytes + entry_bytes[i] > options.max_shard_bytes) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += entry_bytes[i];
  }
  ordered_json weight_map = ordered_json::object();
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    const std::string file_name = options.max_shard_bytes > 0 ? name : "model.safetensors";
    std::vector<SafetensorsEntry> part;
    for (size_t i : groups[g]) {
      part.push_back(entries[i]);
      weight_map[entries[i].name] = file_name;
      total += entry_bytes[i];
    }
    TESSERA_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file_name, part));
  }
  auto write = [](const std::string& path, const std::string& text) -> Status {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return InternalError("writing '" + path + "' failed");
    return Status::Ok();
  };
  std::filesystem::remove(dir + "/model.safetensors.index.json", ec);
  if (options.max_shard_bytes > 0) {
    ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    TESSERA_RETURN_IF_ERROR(write(dir + "/model.safetensors.index.json", index.dump(2)));
  }

  ordered_json config = ordered_json::object();
  const bool moe = c.is_moe();
  config["architectures"] = {moe                   ? "MixtralForCausalLM"
                             : c.arch == "qwen2"   ? "Qwen2ForCausalLM"
                             : c.arch == "mistral" ? "MistralForCausalLM"
                                                   : "LlamaForCausalLM"};
  config["model_type"] = moe ? "mixtral" : c.arch;
  config["hidden_size"] = c.dim;
  config["intermediate_size"] = moe ? c.expert_ffn_dim : c.ffn_dim;
  config["num_hidden_layers"] = c.num_layers;
  config["num_attention_heads"] = c.num_heads;
  config["num_key_value_heads"] = c.num_kv_heads;
  config["head_dim"] = c.head_dim;
  config["hidden_act"] = "silu";
  config["max_position_embeddings"] = c.context_length;
  config["rms_norm_eps"] = c.rms_eps;
  config["rope_theta"] = c.rope_theta;
  config["vocab_size"] = c.vocab_size;
  config["tie_word_embeddings"] = c.tied_output;
  if (moe) {
    config["num_local_experts"] = c.num_experts;
    config["num_experts_per_tok"] = c.num_experts_used;
  }
  if (c.rope_scaling != RopeScaling::kNone) {
    ordered_json s = {{"rope_type", std::string(RopeScalingName(c.rope_scaling))},
                      {"factor", c.rope_scaling_factor}};
    if (c.rope_scaling == RopeScaling::kYarn) {
      s["original_max_position_embeddings"] = c.rope_original_context;
    }
    config["rope_scaling"] = s;
  }
  if (c.rope_dim != c.head_dim) {
    return InvalidArgumentError("GGUF '" + file.name() + "': partial RoPE cannot be exported");
  }
  if (llama && c.attn_qkv_bias) {
    return InvalidArgumentError("GGUF '" + file.name() +
                                "': query/key biases on a llama-layout model cannot be exported");
  }
  const WeightType main = options.dtype.value_or(file.FindTensor("token_embd.weight")->type);
  config["torch_dtype"] = main == WeightType::kF32   ? "float32"
                          : main == WeightType::kF16 ? "float16"
                                                     : "bfloat16";
  Result<int64_t> bos = file.GetIntOr("tokenizer.ggml.bos_token_id", -1);
  Result<int64_t> eos = file.GetIntOr("tokenizer.ggml.eos_token_id", -1);
  if (bos.ok() && *bos >= 0 && *bos < c.vocab_size) config["bos_token_id"] = *bos;
  if (eos.ok() && *eos >= 0 && *eos < c.vocab_size) config["eos_token_id"] = *eos;
  TESSERA_RETURN_IF_ERROR(write(dir + "/config.json", config.dump(2)));

  std::string tokenizer, tokenizer_config;
  TESSERA_RETURN_IF_ERROR(GgufTokenizerToHf(file, &tokenizer, &tokenizer_config));
  TESSERA_RETURN_IF_ERROR(write(dir + "/tokenizer.json", tokenizer));
  return write(dir + "/tokenizer_config.json", tokenizer_config);
}

}  // namespace tessera::model
