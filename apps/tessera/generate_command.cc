// `tessera generate MODEL.gguf -p PROMPT -n N [sampling] [--threads T]
// [--kv-type f32|f16] [--dump-logits FILE]`: one-shot generation on one rank.
// Streams the text to stdout as tokens arrive (incomplete UTF-8 held back) and
// ends with a stats line on stderr.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/tessera/commands.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "model/sampler.h"

namespace tessera::cli {
namespace {

struct GenerateArgs {
  std::string model_path;
  std::string prompt;
  int64_t num_tokens = 128;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  int64_t seed = -1;
  int threads = 0;
  std::string kv_type = "f16";
  int64_t context = 0;
  int64_t prefill_chunk = 512;
  std::string dump_logits_path;
  bool ignore_eos = false;
  bool no_display_prompt = false;
};

Status RunGenerate(const GenerateArgs& args) {
  model::SamplingParams sampling;
  sampling.temperature = args.temperature;
  sampling.top_k = args.top_k;
  sampling.top_p = args.top_p;
  sampling.min_p = args.min_p;
  sampling.repeat_penalty = args.repeat_penalty;
  sampling.repeat_last_n = args.repeat_last_n;
  sampling.seed = args.seed >= 0 ? static_cast<uint64_t>(args.seed) : std::random_device{}();
  TESSERA_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  if (args.num_tokens < 0) return InvalidArgumentError("-n must be >= 0");
  if (args.kv_type != "f32" && args.kv_type != "f16") {
    return InvalidArgumentError("--kv-type must be f32 or f16, not '" + args.kv_type + "'");
  }

  TESSERA_ASSIGN_OR_RETURN(engine::LoadedModel loaded, engine::LoadModel(args.model_path));
  const model::Tokenizer& tokenizer = *loaded.tokenizer;
  std::vector<int32_t> prompt = tokenizer.Encode(args.prompt);
  if (prompt.empty()) return InvalidArgumentError("the prompt encodes to no tokens");

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> dump(nullptr, &std::fclose);
  if (!args.dump_logits_path.empty()) {
    dump.reset(std::fopen(args.dump_logits_path.c_str(), "wb"));
    if (!dump) return NotFoundError("cannot create --dump-logits file " + args.dump_logits_path);
  }

  const int threads =
      args.threads > 0 ? args.threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  engine::GeneratorOptions options;
  options.kv_type = args.kv_type == "f32" ? kernels::KvType::kF32 : kernels::KvType::kF16;
  options.max_context_tokens =
      args.context > 0
          ? args.context
          : std::max<int64_t>(1, static_cast<int64_t>(prompt.size()) + args.num_tokens);
  options.prefill_chunk_tokens = args.prefill_chunk;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<engine::Generator> generator,
                           engine::Generator::Create(*loaded.model, pool, options));

  if (!args.no_display_prompt) {
    std::fputs(args.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  model::IncrementalDecoder decoder(tokenizer);
  bool write_failed = false;
  engine::GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = args.num_tokens;
  request.sampling = sampling;
  request.on_token = [&](int32_t token) {
    if (!args.ignore_eos && tokenizer.IsEndOfGeneration(token)) return false;
    const std::string text = decoder.Push(token);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  if (dump) {
    request.on_logits = [&](std::span<const float> logits) {
      if (std::fwrite(logits.data(), sizeof(float), logits.size(), dump.get()) != logits.size()) {
        write_failed = true;
      }
    };
  }
  TESSERA_ASSIGN_OR_RETURN(engine::GenerationStats stats, generator->Generate(request));
  const std::string rest = decoder.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (write_failed || (dump && std::fflush(dump.get()) != 0)) {
    return InternalError("writing --dump-logits file " + args.dump_logits_path + " failed");
  }
  std::fprintf(stderr,
               "prompt %lld tokens | prefill %.1f tok/s (%.2f ms) | TTFT %.2f ms | generated "
               "%lld tokens, %.1f tok/s | threads %d, kv %s, seed %llu\n",
               static_cast<long long>(stats.prompt_tokens), stats.prefill_tokens_per_s(),
               stats.prefill_seconds * 1e3, stats.ttft_seconds * 1e3,
               static_cast<long long>(stats.generated_tokens), stats.decode_tokens_per_s(), threads,
               args.kv_type.c_str(), static_cast<unsigned long long>(sampling.seed));
  return Status::Ok();
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (one rank)");
  cmd->add_option("model", args->model_path, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", args->num_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temp", args->temperature, "Temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Top-p (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", args->min_p, "Min-p (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", args->repeat_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", args->repeat_last_n, "Tokens the penalty looks back over")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed (default: random, printed at the end)");
  cmd->add_option("-t,--threads", args->threads, "Compute threads (default: all cores)");
  cmd->add_option("--kv-type", args->kv_type, "KV cache type: f32 or f16")->capture_default_str();
  cmd->add_option("-c,--ctx", args->context,
                  "KV cache capacity in tokens (default: prompt + n-predict)");
  cmd->add_option("--prefill-chunk", args->prefill_chunk, "Prompt tokens per prefill step")
      ->capture_default_str();
  cmd->add_option("--dump-logits", args->dump_logits_path,
                  "Write the raw f32 logits of every generated position (little-endian, "
                  "position after position) to FILE");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating after end-of-generation");
  cmd->add_flag("--no-display-prompt", args->no_display_prompt, "Do not echo the prompt");
  cmd->callback([args, exit_code] {
    Status status = RunGenerate(*args);
    if (!status.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "tessera generate: error: %s\n", status.ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
