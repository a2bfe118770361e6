// `tessera inspect MODEL.gguf [--json]`: a GGUF's metadata, the model's
// hyper-parameters (ModelConfig), its tokenizer and a tensor table with totals.
// Exit 1 when the file is malformed, or has tensors but does not load as a model.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>

#include "apps/tessera/commands.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"

namespace tessera::cli {
namespace {

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonValue(const model::GgufValue& v) {
  using model::GgufType;
  switch (v.type()) {
    case GgufType::kString:
      return JsonString(v.as_string());
    case GgufType::kBool:
      return v.as_bool() ? "true" : "false";
    case GgufType::kArray:
      return "{\"array_of\": " + JsonString(model::GgufTypeName(v.array_type())) +
             ", \"size\": " + std::to_string(v.array_size()) + "}";
    case GgufType::kF32:
    case GgufType::kF64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.9g", v.as_f64());
      return buf;
    }
    default:
      return v.Summary();  // integers
  }
}

std::string Shape(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

struct Report {
  const model::GgufFile* file;
  Result<model::ModelConfig> config = InternalError("not read");
  Status tensors_status;
  Result<model::Tokenizer> tokenizer = InternalError("not read");
  int64_t params = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // type -> tensors, bytes
};

const char* VocabName(const model::Tokenizer& t) {
  if (t.kind() == model::VocabKind::kSpm) return "spm (llama)";
  switch (t.pre_tokenizer()) {
    case model::PreTokenizer::kLlama3:
      return "bpe (gpt2, llama3 pre-tokenizer)";
    case model::PreTokenizer::kQwen2:
      return "bpe (gpt2, qwen2 pre-tokenizer)";
    default:
      return "bpe (gpt2)";
  }
}

void PrintText(const Report& r) {
  const model::GgufFile& f = *r.file;
  if (model::IsCheckpointDirectory(f.name())) {
    std::printf(
        "checkpoint:   %s (%zu bytes of safetensors; Hugging Face config and tokenizer "
        "shown as the GGUF metadata they map to)\n",
        f.name().c_str(), f.file_bytes());
  } else {
    std::printf("file:         %s (%zu bytes, GGUF v%u, alignment %u, data at %zu)\n",
                f.name().c_str(), f.file_bytes(), f.version(), f.alignment(), f.data_offset());
  }
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  for (const model::GgufKeyValue& kv : f.metadata()) {
    std::printf("  %-44.*s %s\n", static_cast<int>(kv.key.size()), kv.key.data(),
                kv.value.Summary().c_str());
  }
  std::printf("\nmodel:\n");
  if (!r.config.ok()) {
    std::printf("  not loadable: %s\n", r.config.status().ToString().c_str());
  } else {
    const model::ModelConfig& c = *r.config;
    std::printf("  architecture  %s%s (%s)\n", c.arch.c_str(), c.is_moe() ? " MoE" : "",
                c.name.c_str());
    std::printf("  vocab %lld, context %lld, dim %lld, layers %lld\n",
                static_cast<long long>(c.vocab_size), static_cast<long long>(c.context_length),
                static_cast<long long>(c.dim), static_cast<long long>(c.num_layers));
    std::printf("  heads %lld, kv heads %lld, head dim %lld, ffn %lld, rms eps %g\n",
                static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
                static_cast<long long>(c.head_dim), static_cast<long long>(c.ffn_dim), c.rms_eps);
    std::printf("  rope: theta %g, dims %lld, layout %s, scaling %s", c.rope_theta,
                static_cast<long long>(c.rope_dim),
                std::string(RopeLayoutName(c.rope_layout)).c_str(),
                std::string(RopeScalingName(c.rope_scaling)).c_str());
    if (c.rope_freq_factors) std::printf(", frequency factors (rope_freqs.weight)");
    if (c.rope_scaling != model::RopeScaling::kNone) {
      std::printf(" x%g (original context %lld)", c.rope_scaling_factor,
                  static_cast<long long>(c.rope_original_context));
    }
    std::printf("\n");
    if (c.is_moe()) {
      std::printf("  experts %lld, used %lld, expert ffn %lld, shared expert ffn %lld\n",
                  static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_used),
                  static_cast<long long>(c.expert_ffn_dim),
                  static_cast<long long>(c.shared_expert_ffn_dim));
    }
    std::printf("  attention biases: qkv %s, output %s; output: %s\n",
                c.attn_qkv_bias ? "yes" : "no", c.attn_output_bias ? "yes" : "no",
                c.tied_output ? "tied to token_embd" : "own");
    std::printf("  tensors check: %s\n",
                r.tensors_status.ok() ? "OK" : r.tensors_status.ToString().c_str());
  }
  std::printf("\ntokenizer:\n");
  if (!r.tokenizer.ok()) {
    std::printf("  not loadable: %s\n", r.tokenizer.status().ToString().c_str());
  } else {
    const model::Tokenizer& t = *r.tokenizer;
    std::printf("  %s, %lld tokens, bos %d, eos %d, unk %d, add bos %s\n", VocabName(t),
                static_cast<long long>(t.vocab_size()), t.bos_id(), t.eos_id(), t.unk_id(),
                t.add_bos() ? "yes" : "no");
  }
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  std::printf("  %-32s %-6s %-22s %14s\n", "name", "type", "shape", "bytes");
  for (const model::GgufTensor& t : f.tensors()) {
    std::printf("  %-32.*s %-6s %-22s %14zu\n", static_cast<int>(t.name.size()), t.name.data(),
                std::string(kernels::TraitsOf(t.type).name).c_str(), t.ShapeString().c_str(),
                t.size_bytes());
  }
  std::printf("\ntotals: %zu tensors, %lld parameters, %zu bytes (%.2f MiB)", f.tensors().size(),
              static_cast<long long>(r.params), f.total_tensor_bytes(),
              static_cast<double>(f.total_tensor_bytes()) / (1 << 20));
  for (const auto& [type, count_bytes] : r.by_type) {
    std::printf("; %s: %lld (%.2f MiB)", type.c_str(), static_cast<long long>(count_bytes.first),
                static_cast<double>(count_bytes.second) / (1 << 20));
  }
  std::printf("\n");
}

void PrintJson(const Report& r) {
  const model::GgufFile& f = *r.file;
  std::string out = "{\n";
  out += "  \"file\": " + JsonString(f.name()) + ",\n";
  out += "  \"file_bytes\": " + std::to_string(f.file_bytes()) + ",\n";
  out += "  \"gguf_version\": " + std::to_string(f.version()) + ",\n";
  out += "  \"alignment\": " + std::to_string(f.alignment()) + ",\n";
  out += "  \"metadata\": {";
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    const model::GgufKeyValue& kv = f.metadata()[i];
    out += (i ? ",\n    " : "\n    ") + JsonString(kv.key) + ": " + JsonValue(kv.value);
  }
  out += "\n  },\n";
  if (r.config.ok()) {
    const model::ModelConfig& c = *r.config;
    char eps[32], theta[32], factor[32];
    std::snprintf(eps, sizeof(eps), "%.9g", c.rms_eps);
    std::snprintf(theta, sizeof(theta), "%.9g", c.rope_theta);
    std::snprintf(factor, sizeof(factor), "%.9g", c.rope_scaling_factor);
    auto i = [](int64_t v) { return std::to_string(v); };
    out += "  \"config\": {\"arch\": " + JsonString(c.arch) + ", \"name\": " + JsonString(c.name) +
           ", \"vocab_size\": " + i(c.vocab_size) + ", \"context_length\": " + i(c.context_length) +
           ", \"dim\": " + i(c.dim) + ", \"num_layers\": " + i(c.num_layers) +
           ", \"num_heads\": " + i(c.num_heads) + ", \"num_kv_heads\": " + i(c.num_kv_heads) +
           ", \"head_dim\": " + i(c.head_dim) + ", \"ffn_dim\": " + i(c.ffn_dim) +
           ", \"rms_eps\": " + eps + ", \"rope_theta\": " + theta +
           ", \"rope_dim\": " + i(c.rope_dim) +
           ", \"rope_layout\": " + JsonString(RopeLayoutName(c.rope_layout)) +
           ", \"rope_scaling\": " + JsonString(RopeScalingName(c.rope_scaling)) +
           ", \"rope_scaling_factor\": " + factor + ", \"num_experts\": " + i(c.num_experts) +
           ", \"num_experts_used\": " + i(c.num_experts_used) +
           ", \"expert_ffn_dim\": " + i(c.expert_ffn_dim) +
           ", \"shared_expert_ffn_dim\": " + i(c.shared_expert_ffn_dim) +
           ", \"attn_qkv_bias\": " + (c.attn_qkv_bias ? "true" : "false") +
           ", \"rope_freq_factors\": " + (c.rope_freq_factors ? "true" : "false") +
           ", \"tied_output\": " + (c.tied_output ? "true" : "false") + "},\n";
    out +=
        "  \"tensors_check\": " +
        (r.tensors_status.ok() ? std::string("\"OK\"") : JsonString(r.tensors_status.ToString())) +
        ",\n";
  } else {
    out += "  \"config_error\": " + JsonString(r.config.status().ToString()) + ",\n";
  }
  if (r.tokenizer.ok()) {
    const model::Tokenizer& t = *r.tokenizer;
    out += "  \"tokenizer\": {\"kind\": " + JsonString(VocabName(t)) +
           ", \"vocab_size\": " + std::to_string(t.vocab_size()) +
           ", \"bos_id\": " + std::to_string(t.bos_id()) +
           ", \"eos_id\": " + std::to_string(t.eos_id()) +
           ", \"add_bos\": " + (t.add_bos() ? "true" : "false") + "},\n";
  } else {
    out += "  \"tokenizer_error\": " + JsonString(r.tokenizer.status().ToString()) + ",\n";
  }
  out += "  \"tensors\": [";
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const model::GgufTensor& t = f.tensors()[i];
    out += std::string(i ? ",\n    " : "\n    ") + "{\"name\": " + JsonString(t.name) +
           ", \"type\": " + JsonString(kernels::TraitsOf(t.type).name) +
           ", \"shape\": " + Shape(t.dims) + ", \"bytes\": " + std::to_string(t.size_bytes()) +
           ", \"offset\": " + std::to_string(t.offset) + "}";
  }
  out += "\n  ],\n";
  out += "  \"totals\": {\"tensors\": " + std::to_string(f.tensors().size()) +
         ", \"parameters\": " + std::to_string(r.params) +
         ", \"bytes\": " + std::to_string(f.total_tensor_bytes()) + "}\n}\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Print a GGUF model's metadata, hyper-parameters, tokenizer and tensors");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("model", *path, "GGUF file or Hugging Face checkpoint directory")->required();
  cmd->add_flag("--json", *json, "print JSON instead of text");
  cmd->callback([path, json, exit_code] {
    Result<model::GgufFile> file = model::OpenModelFile(*path);
    if (!file.ok()) {
      std::fprintf(stderr, "tessera inspect: %s\n", file.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    Report r;
    r.file = &*file;
    r.config = model::ModelConfigFromGguf(*file);
    if (r.config.ok()) r.tensors_status = model::ValidateModelTensors(*file, *r.config);
    r.tokenizer = model::Tokenizer::FromGguf(*file);
    for (const model::GgufTensor& t : file->tensors()) {
      r.params += t.num_elements;
      auto& entry = r.by_type[std::string(kernels::TraitsOf(t.type).name)];
      entry.first += 1;
      entry.second += t.size_bytes();
    }
    if (*json) {
      PrintJson(r);
    } else {
      PrintText(r);
    }
    bool model_ok = r.config.ok() && r.tensors_status.ok();
    if (!file->tensors().empty() && !model_ok) {
      std::fprintf(stderr, "tessera inspect: %s does not load as a model: %s\n", path->c_str(),
                   (!r.config.ok() ? r.config.status() : r.tensors_status).ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
