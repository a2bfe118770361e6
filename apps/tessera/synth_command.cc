// `tessera synth`: writes a deterministic random-weight llama/MoE GGUF of any shape
// (model/synth.h), then re-opens it to check it loads.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "apps/tessera/commands.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/synth.h"

namespace tessera::cli {

void AddSynthCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "synth", "Write a random-weight llama-family GGUF model (dense or MoE) of any shape");
  struct Args {
    model::SynthOptions options;
    std::string arch = "llama";
    std::string type = "f16";
    std::string format = "gguf";
    std::string dtype;
    double shard_mib = 0;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  model::SynthOptions& o = args->options;
  cmd->add_option("--arch", args->arch, "llama (dense) or moe (Mixtral-style experts)")
      ->check(CLI::IsMember({"llama", "moe"}));
  cmd->add_option("--dim", o.dim, "embedding size")->required();
  cmd->add_option("--layers", o.num_layers, "number of transformer blocks")->required();
  cmd->add_option("--heads", o.num_heads, "attention heads")->required();
  cmd->add_option("--kv-heads", o.num_kv_heads, "key/value heads (GQA; default = heads)");
  cmd->add_option("--ffn", o.ffn_dim, "FFN hidden size (per expert for moe)")->required();
  cmd->add_option("--experts", o.num_experts, "experts per layer (moe)");
  cmd->add_option("--experts-used", o.num_experts_used, "experts routed per token (moe)");
  cmd->add_option("--router-skew", o.router_skew,
                  "MoE: favour the first quarter of the experts (0 = uniform routing; 0.4 gives "
                  "them about half the rows, 1 nearly all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--router-skew-by-layer", o.router_skew_by_layer,
                "with --router-skew: layer l favours the (l mod 4)-th quarter of the experts");
  cmd->add_option("--shared-expert-ffn", o.shared_expert_ffn_dim,
                  "moe: a qwen2moe model with a sigmoid-gated shared expert of this hidden size");
  cmd->add_option("--vocab", o.vocab_size, "vocabulary size (default: --vocab-from's, else 512)");
  cmd->add_option("--ctx", o.context_length, "context length")->capture_default_str();
  cmd->add_option("--rope-theta", o.rope_theta, "RoPE base frequency")->capture_default_str();
  cmd->add_option("--type", args->type,
                  "matrix type: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k (K-quants: --dim and "
                  "--ffn multiples of 256)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"}))
      ->capture_default_str();
  cmd->add_option("--vocab-from", o.vocab_from, "copy the tokenizer from this GGUF");
  cmd->add_option("--seed", o.seed, "random seed (same seed, same bytes)")->capture_default_str();
  cmd->add_option("--name", o.name, "general.name (default: derived from the shape)");
  cmd->add_flag("--tied", o.tied_output, "no output.weight: the head is the embedding's matrix");
  cmd->add_option("--damp-from", o.damp_from,
                  "blocks from this one on add --damp x their output to the residual stream "
                  "(a synth of this many blocks and the same --seed is then an exact draft at "
                  "--damp 0, a near one at small --damp: speculative-decoding pairs)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--damp", o.damp, "scale of the damped blocks' output (default 1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--format", args->format,
                  "gguf (a file) or safetensors (a Hugging Face checkpoint directory: "
                  "config.json, *.safetensors, tokenizer.json, tokenizer_config.json)")
      ->check(CLI::IsMember({"gguf", "safetensors"}))
      ->capture_default_str();
  cmd->add_option("--shard-mib", args->shard_mib,
                  "safetensors: split the weights into files of at most this many MiB, with "
                  "model.safetensors.index.json (default: one model.safetensors)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", args->dtype,
                  "safetensors: store every tensor as f32, f16 or bf16 (default: matrices as "
                  "--type, norms f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_option("-o,--output", args->out, "output GGUF path (safetensors: directory)")
      ->required();

  cmd->callback([args, exit_code] {
    static const std::map<std::string, kernels::WeightType> kTypes = {
        {"f32", kernels::WeightType::kF32},   {"f16", kernels::WeightType::kF16},
        {"bf16", kernels::WeightType::kBF16}, {"q8_0", kernels::WeightType::kQ8_0},
        {"q4_0", kernels::WeightType::kQ4_0}, {"q4_k", kernels::WeightType::kQ4_K},
        {"q6_k", kernels::WeightType::kQ6_K}};
    model::SynthOptions& o = args->options;
    o.moe = args->arch == "moe";
    o.type = kTypes.at(args->type);
    auto start = std::chrono::steady_clock::now();
    const bool hf = args->format == "safetensors";
    // A checkpoint is written from the GGUF of the same weights, then that is removed.
    const std::string gguf_path = hf ? args->out + "/.synth-tmp.gguf" : args->out;
    std::error_code ec;
    if (hf) std::filesystem::create_directories(args->out, ec);
    Status status = ec ? InvalidArgumentError("cannot create '" + args->out + "': " + ec.message())
                       : model::WriteSynthModel(o, gguf_path);
    if (status.ok() && hf) {
      if (o.type != kernels::WeightType::kF32 && o.type != kernels::WeightType::kF16 &&
          o.type != kernels::WeightType::kBF16) {
        status = InvalidArgumentError("--format safetensors needs --type f32, f16 or bf16");
      }
      Result<model::GgufFile> source = model::GgufFile::Open(gguf_path);
      model::HfExportOptions export_options;
      if (!args->dtype.empty()) export_options.dtype = kTypes.at(args->dtype);
      export_options.max_shard_bytes = static_cast<int64_t>(args->shard_mib * (1 << 20));
      if (status.ok()) status = source.status();
      if (status.ok()) status = model::ExportHfCheckpoint(*source, args->out, export_options);
      std::remove(gguf_path.c_str());
    }
    if (!status.ok()) {
      std::fprintf(stderr, "tessera synth: %s\n", status.ToString().c_str());
      *exit_code = 1;
      return;
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Result<model::GgufFile> file = model::OpenModelFile(args->out);
    Result<model::ModelConfig> config =
        file.ok() ? model::ModelConfigFromGguf(*file) : Result<model::ModelConfig>(file.status());
    if (config.ok()) status = model::ValidateModelTensors(*file, *config);
    if (!config.ok() || !status.ok()) {
      std::fprintf(stderr, "tessera synth: the written file does not load: %s\n",
                   (!config.ok() ? config.status() : status).ToString().c_str());
      *exit_code = 1;
      return;
    }
    int64_t params = 0;
    for (const model::GgufTensor& t : file->tensors()) params += t.num_elements;
    std::printf("wrote %s: %s, %lld params, %.1f MiB, in %.2f s\n", args->out.c_str(),
                config->name.c_str(), static_cast<long long>(params),
                static_cast<double>(file->file_bytes()) / (1 << 20), seconds);
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
