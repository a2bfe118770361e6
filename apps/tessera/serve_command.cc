// `tessera serve MODEL.gguf [--host H --port P] [--api-key KEY] [--tp N --pp M …]
// [--max-num-seqs S --max-num-batched-tokens T --max-waiting W] [--chat-template F]`:
// the OpenAI-compatible HTTP server. On one rank, or over tp × pp ranks (started
// here, or by `tessera launch`/mpirun/srun): the driver rank runs the scheduler on
// its own thread and the HTTP server on this one; the other ranks serve steps.
// SIGINT/SIGTERM: stop accepting, cancel in-flight requests, stop every rank.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "apps/tessera/commands.h"
#include "base/clock.h"

#ifdef TESSERA_HAVE_SERVE
#include "apps/tessera/parallel_run.h"
#include "base/status.h"
#include "comm/rank_env.h"
#include "engine/driver.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metered_executor.h"
#include "serve/metrics.h"
#include "serve/openai_server.h"
#endif

namespace tessera::cli {
#ifdef TESSERA_HAVE_SERVE
namespace {

struct ServeArgs {
  std::string model_path;
  std::string model_name;  // default: the file's stem
  serve::ServerOptions server;
  engine::SchedulerOptions scheduler;
  bool no_prefix_cache = false;
  int64_t kv_capacity_tokens = 0;
  std::string chat_template;  // a family name or a Jinja template's text
  std::string kv_type = "f16";
  int threads = 0;
  ParallelFlags parallel;
};

std::string FileStem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

// The chat template: --chat-template (a family name, or a template text), else
// the GGUF's tokenizer.chat_template. Null with a message when there is none.
std::unique_ptr<serve::ChatTemplate> LoadChatTemplate(const ServeArgs& args,
                                                      const model::GgufFile& file,
                                                      const model::Tokenizer& tokenizer,
                                                      std::string* error) {
  Result<serve::ChatFamily> family = NotFoundError("");
  if (!args.chat_template.empty()) {
    family = serve::ChatFamilyFromName(args.chat_template);
    if (!family.ok()) family = serve::DetectChatFamily(args.chat_template);
  } else {
    Result<std::string_view> text = file.GetStringOr("tokenizer.chat_template", "");
    if (!text.ok() || text->empty()) {
      *error =
          "this model has no chat template (tokenizer.chat_template); use /v1/completions, or "
          "start the server with --chat-template FAMILY (llama-2, llama-3, chatml, mistral, "
          "zephyr)";
      return nullptr;
    }
    family = serve::DetectChatFamily(*text);
  }
  if (!family.ok()) {
    *error = family.status().message();
    return nullptr;
  }
  auto text_of = [&](model::TokenId id) {
    return id >= 0 ? std::string(tokenizer.TokenText(id)) : std::string();
  };
  return std::make_unique<serve::ChatTemplate>(*family, text_of(tokenizer.bos_id()),
                                               text_of(tokenizer.eos_id()));
}

Status Drive(const ServeArgs& args, const model::GgufFile& file, engine::StageRunner& runner,
             const sigset_t& stop_signals) {
  TESSERA_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::FromGguf(file));
  std::string chat_error;
  std::unique_ptr<serve::ChatTemplate> chat = LoadChatTemplate(args, file, tokenizer, &chat_error);
  if (!chat) std::fprintf(stderr, "tessera serve: chat disabled: %s\n", chat_error.c_str());

  engine::Driver driver(runner);
  serve::Metrics metrics;
  serve::MeteredExecutor metered(driver, runner.groups(), metrics);
  engine::SchedulerOptions scheduler_options = args.scheduler;
  scheduler_options.enable_prefix_cache = !args.no_prefix_cache;
  if (Status valid = engine::ValidateSchedulerOptions(scheduler_options, metered); !valid.ok()) {
    Status shutdown = driver.Shutdown().status();
    return valid;
  }
  engine::Scheduler scheduler(metered, tokenizer, scheduler_options);
  serve::OpenAiServer server(scheduler, tokenizer, chat.get(), chat_error, metrics, args.server);
  Result<int> port = server.Bind();
  if (!port.ok()) {
    Status shutdown = driver.Shutdown().status();
    return port.status();
  }

  Status run_status;
  std::thread scheduler_thread([&] {
    run_status = scheduler.Run();
    if (!run_status.ok()) server.Stop();  // the engine failed: nothing left to serve
  });
  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    const timespec poll = {0, 200'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &poll);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "tessera serve: signal %d: cancelling requests, stopping\n", sig);
        scheduler.Stop(/*cancel_in_flight=*/true);
        // Open streams get their "cancelled" chunk and [DONE] before the HTTP
        // server stops (at most 2 s).
        const int64_t deadline = NowNs() + 2'000'000'000;
        while (server.open_streams() > 0 && NowNs() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        server.Stop();
        return;
      }
    }
  });
  std::fprintf(stderr, "tessera serve: %s on http://%s:%d (%s, max model len %lld)\n",
               args.server.model_name.c_str(), args.server.host.c_str(), *port,
               runner.plan().ToString().c_str(), static_cast<long long>(scheduler.max_model_len()));
  Status serve_status = server.Serve();
  scheduler.Stop(/*cancel_in_flight=*/true);
  scheduler_thread.join();
  done.store(true);
  signal_thread.join();
  Result<std::vector<engine::RankReport>> reports = driver.Shutdown();
  TESSERA_RETURN_IF_ERROR(run_status);
  TESSERA_RETURN_IF_ERROR(serve_status);
  return reports.status();
}

Status RunServe(ServeArgs args) {
  if (args.kv_type != "f32" && args.kv_type != "f16") {
    return InvalidArgumentError("--kv-type must be f32 or f16, not '" + args.kv_type + "'");
  }
  if (args.scheduler.max_num_seqs < 1 || args.scheduler.max_num_batched_tokens < 1 ||
      args.scheduler.max_waiting < 0) {
    return InvalidArgumentError(
        "--max-num-seqs and --max-num-batched-tokens must be >= 1, --max-waiting >= 0");
  }
  TESSERA_ASSIGN_OR_RETURN(comm::RankEnv env, comm::RankEnvFromEnvironment());
  TESSERA_ASSIGN_OR_RETURN(std::optional<int> launched,
                           LaunchRanksIfNeeded(args.model_path, args.parallel, env));
  if (launched) {
    // 128 + SIGINT/SIGTERM: the job was stopped by a signal, as asked.
    if (*launched != 0 && *launched != 128 + SIGINT && *launched != 128 + SIGTERM) {
      return InternalError("a rank failed (exit code " + std::to_string(*launched) + ")");
    }
    return Status::Ok();
  }
  // Every thread (the compute pool, comm progress, HTTP) inherits the blocked
  // stop signals; only the driver's watcher thread takes them. Workers leave them
  // blocked and stop when the driver says so.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a signal

  {
    TESSERA_ASSIGN_OR_RETURN(model::GgufFile probe, model::GgufFile::Open(args.model_path));
    TESSERA_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfigFromGguf(probe));
    if (args.scheduler.max_model_len <= 0) args.scheduler.max_model_len = config.context_length;
  }
  if (args.scheduler.max_model_len <= 0) {
    return InvalidArgumentError("the model states no context length; pass --max-model-len");
  }
  engine::RuntimeOptions options;
  options.kv_type = args.kv_type == "f32" ? kernels::KvType::kF32 : kernels::KvType::kF16;
  options.deterministic = !args.parallel.fast;
  options.kv_capacity_tokens = args.kv_capacity_tokens > 0
                                   ? args.kv_capacity_tokens
                                   : std::max(args.scheduler.max_model_len,
                                              std::min<int64_t>(args.scheduler.max_num_seqs, 8) *
                                                  args.scheduler.max_model_len);
  options.max_step_tokens = args.scheduler.max_num_batched_tokens;
  options.max_step_sequences = args.scheduler.max_num_seqs;
  args.scheduler.max_model_len = std::min(args.scheduler.max_model_len, options.kv_capacity_tokens);
  if (args.model_name.empty()) args.model_name = FileStem(args.model_path);
  args.server.model_name = args.model_name;

  ParallelFlags flags = args.parallel;
  flags.threads = args.threads;
  return RunRank(args.model_path, flags, env, options, [&](RankSetup& setup) {
    return Drive(args, *setup.file, *setup.runner, stop_signals);
  });
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)");
  cmd->add_option("model", args->model_path, "GGUF model file")->required();
  cmd->add_option("--host", args->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->server.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", args->server.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (default: $TESSERA_API_KEY)")
      ->envname("TESSERA_API_KEY");
  cmd->add_option("--served-model-name", args->model_name,
                  "Model id clients name (default: the file name without .gguf)");
  cmd->add_option("--chat-template", args->chat_template,
                  "Chat format: llama-2, llama-3, chatml, mistral or zephyr, or a Jinja template "
                  "text to recognise (default: the model's tokenizer.chat_template)");
  cmd->add_option("--max-num-seqs", args->scheduler.max_num_seqs, "Sequences running at once")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", args->scheduler.max_num_batched_tokens,
                  "New tokens per step (decodes + prefill chunks)")
      ->capture_default_str();
  cmd->add_option("--max-waiting", args->scheduler.max_waiting,
                  "Queued requests beyond which new ones get 429")
      ->capture_default_str();
  cmd->add_option("--max-model-len", args->scheduler.max_model_len,
                  "Prompt + completion tokens per request (default: the model's context)");
  cmd->add_option("--kv-tokens", args->kv_capacity_tokens,
                  "KV cache capacity in tokens, shared by all sequences (default: "
                  "min(max-num-seqs, 8) x max-model-len)");
  cmd->add_option("--kv-type", args->kv_type, "KV cache type: f32 or f16")->capture_default_str();
  cmd->add_flag("--no-prefix-cache", args->no_prefix_cache,
                "Recompute every prompt: do not reuse the KV of cached prompt prefixes");
  cmd->add_option("-t,--threads", args->threads, "Compute threads per rank (default: all cores)");
  cmd->add_option("--max-body-bytes", args->server.max_body_bytes, "Largest request body")
      ->capture_default_str();
  cmd->add_option("--http-threads", args->server.http_threads,
                  "HTTP worker threads (each open connection holds one while served)")
      ->capture_default_str();
  cmd->add_option("--read-timeout-s", args->server.read_timeout_s,
                  "Drop a client that sends nothing for this long")
      ->capture_default_str();
  cmd->add_option("--write-timeout-s", args->server.write_timeout_s,
                  "Drop a client that reads nothing for this long")
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout-s", args->server.keep_alive_timeout_s,
                  "Close idle keep-alive connections after this long")
      ->capture_default_str();
  AddParallelFlags(cmd, &args->parallel);
  cmd->callback([args, exit_code] {
    Status status = RunServe(*args);
    if (!status.ok()) {
      std::fprintf(stderr, "tessera serve: error: %s\n", status.ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

#else  // built without src/serve (the engine's scheduler is missing)

void AddServeCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (not built)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    std::fprintf(stderr, "tessera serve: this build has no serving layer (src/serve)\n");
    *exit_code = 1;
  });
}

#endif  // TESSERA_HAVE_SERVE
}  // namespace tessera::cli
