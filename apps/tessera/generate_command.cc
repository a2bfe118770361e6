// `tessera generate MODEL.gguf -p PROMPT -n N [sampling] [--threads T]
// [--kv-type f32|f16] [--dump-logits FILE] [--batch B] [--tp N --pp M …]`:
// one-shot generation, on one rank or split over tp × pp ranks (started here, or
// by `tessera launch`/mpirun/srun). The driver rank streams the text to stdout as
// tokens arrive (incomplete UTF-8 held back; with --batch, each sequence's text at
// the end) and ends with a stats line on stderr, plus the per-rank report and,
// with --ledger, the communication ledger of every step.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/tessera/commands.h"
#include "apps/tessera/ledger_report.h"
#include "apps/tessera/parallel_run.h"
#include "apps/tessera/speculative_flags.h"
#include "base/clock.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "comm/rank_env.h"
#include "engine/driver.h"
#include "engine/expert_rebalancer.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "kv/block_table.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

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
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  int threads = 0;
  std::string kv_type = "f16";
  int64_t kv_capacity_tokens = 0;
  int64_t prefill_chunk = 0;  // 0: 512, or the whole prompt under --cp
  std::string dump_logits_path;
  bool ignore_eos = false;
  bool no_display_prompt = false;
  bool no_prefix_cache = false;
  int64_t batch = 1;
  bool ledger = false;
  bool report = false;
  std::string ep_placement_out;
  ParallelFlags parallel;
  SpeculativeFlags speculative;
};

// --ep-placement-out: a per-layer placement balanced for the run's measured expert
// load (parallel::BalanceExpertsByLayer), with the busiest rank's share before and
// after.
Status WriteBalancedPlacement(const std::string& path,
                              const std::vector<engine::RankReport>& reports,
                              const parallel::Partition& plan, int64_t num_experts) {
  if (plan.ep < 2) return InvalidArgumentError("--ep-placement-out needs --ep 2 or more");
  const std::vector<std::vector<int64_t>> load =
      engine::ExpertLoadByLayer(reports, plan, num_experts);
  const parallel::ExpertPlacement placement =
      parallel::BalanceExpertsByLayer(load, plan.ep, plan.ep_redundant);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return InvalidArgumentError("--ep-placement-out: cannot write " + path);
  const std::string json = placement.ToJson() + "\n";
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !ok) return InternalError("--ep-placement-out: writing " + path);
  std::fprintf(
      stderr,
      "wrote %s: %d replica slot%s a rank, a table per layer; the busiest EP rank's rows "
      "over the mean for this load (summed over the layers) %.2f -> %.2f\n",
      path.c_str(), plan.ep_redundant, plan.ep_redundant == 1 ? "" : "s",
      parallel::BusiestOverMean(parallel::ContiguousPlacement(num_experts, plan.ep), load, plan.ep),
      parallel::BusiestOverMean(placement, load, plan.ep));
  return Status::Ok();
}

Result<model::SamplingParams> SamplingFromArgs(const GenerateArgs& args) {
  model::SamplingParams sampling;
  sampling.temperature = args.temperature;
  sampling.top_k = args.top_k;
  sampling.top_p = args.top_p;
  sampling.min_p = args.min_p;
  sampling.repeat_penalty = args.repeat_penalty;
  sampling.repeat_last_n = args.repeat_last_n;
  sampling.presence_penalty = args.presence_penalty;
  sampling.frequency_penalty = args.frequency_penalty;
  sampling.seed = args.seed >= 0 ? static_cast<uint64_t>(args.seed) : std::random_device{}();
  TESSERA_RETURN_IF_ERROR(model::ValidateSamplingParams(sampling));
  return sampling;
}

// Timings of one sequence, taken from its scheduler events.
struct SequenceClock {
  int64_t first_token_ns = 0;  // 0 until the first token
  int64_t last_token_ns = 0;
  int64_t tokens = 0;
  engine::RequestResult result;
};

// The batch's decode rate once every sequence has its first token, until the
// first one finishes (a pipeline's later micro-batches still prefill while the
// first decode, so this is the steady state); 0 when that window is empty.
double AllDecodingTokensPerSecond(const std::vector<SequenceClock>& clocks,
                                  const std::vector<int64_t>& token_ns) {
  int64_t all_decoding_ns = 0, first_done_ns = INT64_MAX;
  for (const SequenceClock& c : clocks) {
    all_decoding_ns = std::max(all_decoding_ns, c.first_token_ns);
    first_done_ns = std::min(first_done_ns, c.last_token_ns);
  }
  if (clocks.size() < 2 || first_done_ns <= all_decoding_ns) return 0;
  int64_t window_tokens = 0;
  for (int64_t t : token_ns) window_tokens += t > all_decoding_ns && t <= first_done_ns;
  return static_cast<double>(window_tokens) /
         (static_cast<double>(first_done_ns - all_decoding_ns) * 1e-9);
}

// The driver's part: tokenize, run the requests through the scheduler, print.
Status Drive(const GenerateArgs& args, const model::SamplingParams& sampling,
             const model::GgufFile& file, engine::StageRunner& runner, int threads) {
  TESSERA_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::FromGguf(file));
  std::vector<int32_t> prompt = tokenizer.Encode(args.prompt);
  if (prompt.empty()) return InvalidArgumentError("the prompt encodes to no tokens");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> dump(nullptr, &std::fclose);
  if (!args.dump_logits_path.empty()) {
    dump.reset(std::fopen(args.dump_logits_path.c_str(), "wb"));
    if (!dump) return NotFoundError("cannot create --dump-logits file " + args.dump_logits_path);
  }
  engine::Driver driver(runner);
  const int64_t n = args.batch;
  // A sequence's limit: the model's context (when it states one) within the KV cache.
  const int64_t model_context = runner.model().config().context_length;
  engine::SchedulerOptions scheduler_options{
      .max_num_batched_tokens = std::max(args.prefill_chunk, n),
      .max_num_seqs = n,
      .max_waiting = n,
      .max_model_len = model_context > 0
                           ? std::min(driver.sequence_capacity_tokens(), model_context)
                           : driver.sequence_capacity_tokens(),
      .enable_prefix_cache = !args.no_prefix_cache,
      // The copies are one batch by design (--batch measures B sequences computed
      // together): none waits for another's prompt blocks.
      .prefix_wait_min_tokens = 0};
  TESSERA_RETURN_IF_ERROR(
      ApplySpeculativeFlags(args.speculative, tokenizer, threads, scheduler_options));
  TESSERA_RETURN_IF_ERROR(engine::ValidateSchedulerOptions(scheduler_options, driver));
  const int64_t max_model_len = scheduler_options.max_model_len;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (prompt_tokens >= max_model_len) {
    return InvalidArgumentError("the prompt's " + std::to_string(prompt_tokens) +
                                " tokens leave no room in the context of " +
                                std::to_string(max_model_len) + " tokens");
  }
  int64_t num_tokens = args.num_tokens;
  if (prompt_tokens + num_tokens > max_model_len) {
    num_tokens = max_model_len - prompt_tokens;
    std::fprintf(stderr,
                 "tessera generate: -n %lld stops at the context length: %lld tokens (prompt "
                 "%lld + %lld new)\n",
                 static_cast<long long>(args.num_tokens), static_cast<long long>(max_model_len),
                 static_cast<long long>(prompt_tokens), static_cast<long long>(num_tokens));
  }
  const bool streaming = n == 1;
  if (!args.no_display_prompt && streaming) {
    std::fputs(args.prompt.c_str(), stdout);
    std::fflush(stdout);
  }

  // One request per --batch copy of the prompt (seed + i when sampling).
  const size_t count = static_cast<size_t>(n);
  std::vector<std::vector<int32_t>> tokens(count);
  std::vector<std::vector<float>> logits(count);
  std::vector<SequenceClock> clocks(count);
  std::vector<int64_t> token_ns;  // when each token was sampled, all sequences
  model::IncrementalDecoder stream_decoder(tokenizer);
  engine::Scheduler scheduler(driver, tokenizer, scheduler_options);
  const int64_t start_ns = NowNs();
  for (size_t i = 0; i < count && num_tokens > 0; ++i) {
    engine::RequestParams params{.prompt = prompt,
                                 .max_tokens = num_tokens,
                                 .sampling = sampling,
                                 .ignore_eos = args.ignore_eos};
    params.sampling.seed = sampling.seed + i;
    engine::RequestCallbacks callbacks{
        .on_token =
            [&, i](const engine::TokenEvent& event) {
              const int64_t now = NowNs();
              SequenceClock& clock = clocks[i];
              if (clock.first_token_ns == 0) clock.first_token_ns = now;
              clock.last_token_ns = now;
              token_ns.push_back(now);
              if (dump) logits[i].insert(logits[i].end(), event.logits.begin(), event.logits.end());
              if (!args.ignore_eos && tokenizer.IsEndOfGeneration(event.token)) return;
              tokens[i].push_back(event.token);
              if (streaming) {
                const std::string text = stream_decoder.Push(event.token);
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
              }
            },
        .on_done = [&, i](const engine::RequestResult& result) { clocks[i].result = result; }};
    TESSERA_RETURN_IF_ERROR(scheduler.Submit(std::move(params), std::move(callbacks)).status());
  }
  scheduler.Stop(/*cancel_in_flight=*/false);
  const Status run = scheduler.Run();
  const double wall_s = static_cast<double>(NowNs() - start_ns) * 1e-9;
  Result<std::vector<engine::RankReport>> reports = driver.Shutdown();
  TESSERA_RETURN_IF_ERROR(run);
  TESSERA_RETURN_IF_ERROR(reports.status());

  if (streaming) {
    const std::string rest = stream_decoder.Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    for (size_t i = 0; i < count; ++i) {
      model::IncrementalDecoder decoder(tokenizer);
      std::string text = args.no_display_prompt ? "" : args.prompt;
      for (int32_t t : tokens[i]) text += decoder.Push(t);
      text += decoder.Flush();
      std::printf("--- sequence %zu ---\n%s\n", i, text.c_str());
    }
  }
  std::fflush(stdout);
  if (dump) {
    for (const std::vector<float>& l : logits) {
      if (std::fwrite(l.data(), sizeof(float), l.size(), dump.get()) != l.size()) {
        return InternalError("writing --dump-logits file " + args.dump_logits_path + " failed");
      }
    }
    if (std::fflush(dump.get()) != 0) {
      return InternalError("writing --dump-logits file " + args.dump_logits_path + " failed");
    }
  }

  // The first sequence's prefill and TTFT; decode over every sequence's tokens after its
  // first (which prefill produced), over the longest decode.
  const engine::RequestTiming& first = clocks[0].result.timing;
  const double ttft_s = clocks[0].first_token_ns > 0
                            ? static_cast<double>(clocks[0].first_token_ns - start_ns) * 1e-9
                            : 0;
  int64_t generated = 0;
  double decode_s = 0;
  for (const SequenceClock& c : clocks) {
    generated += c.result.completion_tokens;
    decode_s = std::max(decode_s, c.result.timing.decode_s);
  }
  const int64_t decoded = generated - static_cast<int64_t>(num_tokens > 0 ? count : 0);
  const parallel::Partition& plan = runner.plan();
  std::fprintf(stderr,
               "prompt %lld tokens | prefill %.1f tok/s (%.2f ms) | TTFT %.2f ms | generated "
               "%lld tokens, %.1f tok/s",
               static_cast<long long>(prompt_tokens),
               first.prefill_s > 0 ? static_cast<double>(prompt_tokens) / first.prefill_s : 0.0,
               first.prefill_s * 1e3, ttft_s * 1e3, static_cast<long long>(generated),
               decode_s > 0 ? static_cast<double>(decoded) / decode_s : 0.0);
  if (n > 1) {
    std::fprintf(stderr, " (%zu sequences, %.2f s wall; all decoding: %.1f tok/s)", count, wall_s,
                 AllDecodingTokensPerSecond(clocks, token_ns));
  }
  std::fputs(SpeculationSummary(scheduler.Stats()).c_str(), stderr);
  std::fprintf(stderr, " | %s, %d thread%s/rank, kv %s, seed %llu\n", plan.ToString().c_str(),
               threads, threads == 1 ? "" : "s", args.kv_type.c_str(),
               static_cast<unsigned long long>(sampling.seed));
  if (plan.world_size() > 1 || args.report) {
    std::fputs(FormatRankReports(*reports, plan).c_str(), stderr);
    if (plan.ep > 1) {
      std::fputs((ExpertLoadLine(*reports, std::nullopt, plan) + "\n").c_str(), stderr);
    }
  }
  if (!args.ep_placement_out.empty()) {
    TESSERA_RETURN_IF_ERROR(WriteBalancedPlacement(args.ep_placement_out, *reports, plan,
                                                   runner.model().config().num_experts));
  }
  if (args.ledger) {
    TESSERA_ASSIGN_OR_RETURN(std::string ledger,
                             FormatLedger(file, plan, !args.parallel.fast, args.kv_type, *reports));
    std::fputs(ledger.c_str(), stdout);
  }
  return Status::Ok();
}

Status RunGenerate(const GenerateArgs& args) {
  TESSERA_ASSIGN_OR_RETURN(model::SamplingParams sampling, SamplingFromArgs(args));
  if (args.num_tokens < 0) return InvalidArgumentError("-n must be >= 0");
  if (args.batch < 1) return InvalidArgumentError("--batch must be at least 1");
  if (args.prefill_chunk < 0) return InvalidArgumentError("--prefill-chunk must be at least 0");
  if (args.kv_capacity_tokens < 0) return InvalidArgumentError("--kv-tokens (--ctx) must be >= 0");
  if (args.kv_type != "f32" && args.kv_type != "f16") {
    return InvalidArgumentError("--kv-type must be f32 or f16, not '" + args.kv_type + "'");
  }
  TESSERA_RETURN_IF_ERROR(ValidateSpeculativeFlags(args.speculative));  // before any rank starts
  TESSERA_ASSIGN_OR_RETURN(comm::RankEnv env, comm::RankEnvFromEnvironment());
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig config,
                           CheckPlanFitsModel(args.model_path, args.parallel));
  TESSERA_ASSIGN_OR_RETURN(std::optional<int> launched,
                           LaunchRanksIfNeeded(args.model_path, args.parallel, env));
  if (launched) {
    if (*launched != 0)
      return InternalError("a rank failed (exit code " + std::to_string(*launched) + ")");
    return Status::Ok();
  }
  engine::RuntimeOptions options;
  options.kv_type = args.kv_type == "f32" ? kernels::KvType::kF32 : kernels::KvType::kF16;
  options.deterministic = !args.parallel.fast;
  options.record_traffic = args.ledger;
  // Capacity: every sequence's prompt + new tokens, each in whole blocks and at most the
  // model's context (the prompt is encoded by the driver; a bound from the text's bytes
  // keeps every rank's cache equal).
  int64_t per_sequence = static_cast<int64_t>(args.prompt.size()) + 2 + args.num_tokens;
  if (config.context_length > 0) per_sequence = std::min(per_sequence, config.context_length);
  per_sequence = kv::BlocksForTokens(per_sequence, options.block_size) * options.block_size;
  options.kv_capacity_tokens =
      args.kv_capacity_tokens > 0 ? args.kv_capacity_tokens : args.batch * per_sequence;
  // Under --cp a whole prompt in one step runs split over the group (context_blocks.h);
  // a later chunk would run every row on every cp rank. The group holds cp ranks' KV,
  // so a prompt beyond one rank's capacity is still one step.
  GenerateArgs resolved = args;
  if (resolved.prefill_chunk == 0) {
    resolved.prefill_chunk =
        args.parallel.cp > 1 ? options.kv_capacity_tokens * args.parallel.cp : 512;
  }
  options.max_step_tokens = std::max(resolved.prefill_chunk, args.batch);
  options.max_step_sequences = args.batch;
  ParallelFlags flags = args.parallel;
  flags.threads = args.threads;
  return RunRank(args.model_path, flags, env, options, [&](RankSetup& setup) {
    return Drive(resolved, sampling, *setup.file, *setup.runner, setup.threads);
  });
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text from a prompt, on one rank or split over --tp x --pp ranks");
  cmd->add_option("model", args->model_path, "GGUF model file or Hugging Face checkpoint directory")
      ->required();
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
  cmd->add_option("--presence-penalty", args->presence_penalty,
                  "Subtracted from a generated token's logit once it has appeared (-2..2)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", args->frequency_penalty,
                  "Subtracted per earlier occurrence in the generated tokens (-2..2)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed (default: random, printed at the end)");
  cmd->add_option("-t,--threads", args->threads, "Compute threads (default: all cores)");
  cmd->add_option("--kv-type", args->kv_type, "KV cache type: f32 or f16")->capture_default_str();
  cmd->add_option("-c,--ctx,--kv-tokens", args->kv_capacity_tokens,
                  "KV cache capacity in tokens (default: --batch x (prompt + n-predict), each in "
                  "whole blocks and at most the model's context)");
  cmd->add_option(
      "--prefill-chunk", args->prefill_chunk,
      "New tokens per step at most (prefill chunks and decodes together; "
      "0 = the default: 512, under --cp the group's KV capacity, a whole prompt a step)");
  cmd->add_option("--dump-logits", args->dump_logits_path,
                  "Write the raw f32 logits of every generated position (little-endian, "
                  "position after position; with --batch, sequence after sequence) to FILE");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating after end-of-generation");
  cmd->add_flag("--no-display-prompt", args->no_display_prompt, "Do not echo the prompt");
  cmd->add_flag("--no-prefix-cache", args->no_prefix_cache,
                "Do not reuse the KV of a --batch copy's prompt blocks computed by another");
  cmd->add_option("--batch", args->batch,
                  "Run B copies of the prompt together (seeds seed..seed+B-1); pipeline stages "
                  "overlap on micro-batches")
      ->capture_default_str();
  cmd->add_option("--ep-placement-out", args->ep_placement_out,
                  "Under --ep: write an expert placement (for --ep-placement) balanced for this "
                  "run's measured expert load, with --ep-redundant replica slots per rank");
  cmd->add_flag("--ledger", args->ledger,
                "Print the bytes every primitive moved on every group at each step, next to "
                "the exact model and the seeds' formulas");
  cmd->add_flag("--report", args->report, "Print the per-rank report even on one rank");
  AddParallelFlags(cmd, &args->parallel);
  AddSpeculativeFlags(cmd, &args->speculative, /*server=*/false);
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
