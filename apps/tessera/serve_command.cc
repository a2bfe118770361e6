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
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/tessera/commands.h"
#include "base/clock.h"

#ifdef TESSERA_HAVE_SERVE
#include "apps/tessera/parallel_run.h"
#include "apps/tessera/serve_front.h"
#include "apps/tessera/speculative_flags.h"
#include "base/status.h"
#include "comm/launcher.h"
#include "comm/net_util.h"
#include "comm/options.h"
#include "comm/rank_env.h"
#include "comm/rendezvous/tcp_store.h"
#include "engine/driver.h"
#include "engine/expert_rebalancer.h"
#include "engine/scheduler.h"
#include "engine/stage_runner.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metered_executor.h"
#include "serve/metrics.h"
#include "serve/openai_server.h"
#include "serve/pd_link.h"
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
  // --cp without --max-num-batched-tokens: a step takes a whole prompt (up to
  // --max-model-len), which runs split over the cp ranks (model/context_blocks.h).
  bool whole_prompt_steps = false;
  int64_t kv_capacity_tokens = 0;
  std::string chat_template;  // a family name or a Jinja template's text
  std::string kv_type = "f16";
  int threads = 0;
  ParallelFlags parallel;
  SpeculativeFlags speculative;
  double unavailable_after_s = 30;  // of an engine restart, before new requests get 503
  // Data parallelism: a front over dp local replicas and the remote ones.
  int dp = 0;  // 0: not asked (1 replica, no front)
  std::vector<std::string> replicas;
  std::string router = "least-outstanding";
  double router_load_margin = 8;
  std::string pd;  // "P:D": prefill/decode disaggregation (docs/pd.md); "" off
  std::vector<std::string> pd_prefill_urls, pd_decode_urls;  // instances elsewhere
  std::string pd_store;  // HOST:PORT of the front's links store ("" = loopback)
  // Tensor-parallel ranks of each local prefill / decode instance (0: --tp's).
  int prefill_tp = 0, decode_tp = 0;
  // An instance started by hand for a --pd front elsewhere: its store and role.
  std::string pd_join;  // HOST:PORT
  std::string pd_role;  // "prefill:I" or "decode:I"
  double kv_transfer_timeout_s = 30;
  std::string kv_transfer_dtype;  // "" = the cache's own (bit-identical)
  // Live expert re-placement (engine::ExpertRebalancer): seconds between decisions;
  // < 0: 10 with --ep-redundant, else off; 0: off.
  double ep_rebalance_s = -1;
  int64_t ep_rebalance_min_rows = engine::RebalanceOptions{}.min_rows;
};

// The rebalancer --ep-rebalance asks for on this plan, or null (off, no --ep, or no
// replica slots to move copies into).
std::unique_ptr<engine::ExpertRebalancer> MakeRebalancer(const ServeArgs& args,
                                                         const parallel::Partition& plan) {
  const double seconds = args.ep_rebalance_s < 0 ? 10 : args.ep_rebalance_s;
  if (seconds <= 0 || plan.ep < 2 || plan.ep_redundant < 1) return nullptr;
  return std::make_unique<engine::ExpertRebalancer>(
      plan, engine::RebalanceOptions{.interval_ns = static_cast<int64_t>(seconds * 1e9),
                                     .min_rows = args.ep_rebalance_min_rows});
}

std::string FileStem(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();  // a checkpoint directory
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

// The chat template: --chat-template (a family name, or a template text), else
// the GGUF's tokenizer.chat_template, else "plain" (a base model). Null with a
// message when the template is not one tessera can render.
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
      std::fprintf(stderr,
                   "tessera serve: the model has no chat template (tokenizer.chat_template): "
                   "/v1/chat/completions sends the messages' text, one per line, for the model "
                   "to continue ('plain'); --chat-template FAMILY chooses another\n");
      family = serve::ChatFamily::kPlain;
    } else {
      family = serve::DetectChatFamily(*text);
    }
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

// The driver's executor over the runner: rebuilt with it when the ranks restart.
struct DriverEngine {
  std::unique_ptr<engine::Driver> driver;
  std::unique_ptr<serve::MeteredExecutor> metered;
};

// Rank 0's side of rank supervision (a job started by `tessera serve` itself,
// whose launcher restarts the other ranks): when the engine fails — a rank died,
// froze, or the launcher reports it restarted them — the old world is aborted
// and torn down (its shared memory and ports go with it), the launcher is asked
// for new ranks unless it already started them, and this rank sets itself up
// again at their epoch (the model is mmapped: re-binding the shard is fast). The
// scheduler keeps the requests meanwhile and recomputes the running ones.
class EngineRestarter {
 public:
  EngineRestarter(const ServeArgs& args, comm::RankEnv env, const engine::RuntimeOptions& options,
                  RankSetup& setup, DriverEngine& engine, serve::Metrics& metrics)
      : args_(args),
        env_(std::move(env)),
        options_(options),
        setup_(setup),
        engine_(engine),
        metrics_(metrics),
        epoch_in_use_(env_.epoch),
        announced_(env_.epoch) {}

  // The launcher started the ranks of `epoch` (kEpochStartedSignal). True when
  // the engine in use is older, and not being replaced already.
  bool OnEpochStarted(int epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    announced_ = std::max(announced_, epoch);
    announced_cv_.notify_all();
    return epoch > epoch_in_use_ && !recovering_;
  }

  // The scheduler's ExecutorRecovery.
  Result<engine::StepExecutor*> Recover(const Status& failure) {
    const int64_t start_ns = NowNs();
    int lost = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      recovering_ = true;
      lost = epoch_in_use_;
    }
    if (EngineIntact()) {  // a late report of a restart this rank has already joined
      std::lock_guard<std::mutex> lock(mu_);
      recovering_ = false;
      return static_cast<engine::StepExecutor*>(nullptr);
    }
    std::fprintf(stderr, "tessera serve: the engine failed (epoch %d): %s; restarting its ranks\n",
                 lost, failure.ToString().c_str());
    setup_.runner->groups().Abort("the driver is restarting the engine: " + failure.message());
    if (setup_.world.comm) setup_.world.comm->Abort("the driver is restarting the engine");
    serve::CommTotals carried = engine_.metered->Totals();
    engine_.metered.reset();
    engine_.driver.reset();
    { RankSetup old = std::move(setup_); }
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      TESSERA_ASSIGN_OR_RETURN(const int epoch, AwaitNewEpoch(lost));
      env_.epoch = epoch;
      ParallelFlags flags = args_.parallel;
      flags.threads = args_.threads;
      Result<RankSetup> fresh = SetUpRank(args_.model_path, flags, env_, options_);
      if (!fresh.ok()) {
        std::fprintf(stderr, "tessera serve: epoch %d did not come up (attempt %d of %d): %s\n",
                     epoch, attempt, kAttempts, fresh.status().ToString().c_str());
        lost = epoch;
        continue;
      }
      setup_ = std::move(*fresh);
      engine_.driver = std::make_unique<engine::Driver>(*setup_.runner);
      engine_.metered = std::make_unique<serve::MeteredExecutor>(
          *engine_.driver, setup_.runner->groups(), metrics_, std::move(carried));
      engine_.metered->SetRunner(setup_.runner.get());
      engine_.metered->SetReportSource(engine_.driver.get());
      engine_.metered->SetRebalancer(MakeRebalancer(args_, setup_.runner->plan()));
      {
        std::lock_guard<std::mutex> lock(mu_);
        recovering_ = false;
        epoch_in_use_ = epoch;
      }
      std::fprintf(stderr, "tessera serve: the engine is back (epoch %d) after %.2f s\n", epoch,
                   static_cast<double>(NowNs() - start_ns) * 1e-9);
      return engine_.metered.get();
    }
    return UnavailableError("the engine's ranks did not come back after " +
                            std::to_string(kAttempts) + " restarts");
  }

 private:
  static constexpr int kAttempts = 3;
  static constexpr int64_t kEpochWaitMs = 30'000;

  // Whether the engine in use is of the newest epoch and none of its
  // communicators has failed (scheduler thread: the one that runs steps).
  bool EngineIntact() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (announced_ > epoch_in_use_) return false;
    }
    const parallel::Groups& groups = setup_.runner->groups();
    for (const comm::Communicator* comm :
         {setup_.world.comm.get(), groups.tp.get(), groups.pp.get(), groups.ctl.get()}) {
      if (comm != nullptr && comm->poisoned()) return false;
    }
    return true;
  }

  // Asks the launcher to replace `lost` (unless it already did) and waits until
  // it announces a newer epoch.
  Result<int> AwaitNewEpoch(int lost) {
    std::unique_lock<std::mutex> lock(mu_);
    if (announced_ <= lost) {
      union sigval value {};
      value.sival_int = lost;
      if (::sigqueue(env_.supervisor_pid, comm::kRestartRequestSignal, value) != 0) {
        return UnavailableError("cannot reach the launcher (pid " +
                                std::to_string(env_.supervisor_pid) + ") to restart the ranks");
      }
    }
    if (!announced_cv_.wait_for(lock, std::chrono::milliseconds(kEpochWaitMs),
                                [&] { return announced_ > lost; })) {
      return UnavailableError("the launcher started no new ranks within " +
                              std::to_string(kEpochWaitMs / 1000) +
                              " s (its restarts may be used up: --max-restarts)");
    }
    return announced_;
  }

  const ServeArgs& args_;
  comm::RankEnv env_;
  const engine::RuntimeOptions& options_;
  RankSetup& setup_;
  DriverEngine& engine_;
  serve::Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable announced_cv_;
  int epoch_in_use_;
  int announced_;
  bool recovering_ = false;
};

struct PdRole {
  bool prefill = false;
  int index = 0;
  int num_prefill = 0, num_decode = 0;
};

// "prefill|decode:INDEX:P:D" (kPdRoleEnv's form).
Result<PdRole> ParsePdRole(const std::string& text, const std::string& what) {
  PdRole role;
  char kind[16] = {};
  if (std::sscanf(text.c_str(), "%15[a-z]:%d:%d:%d", kind, &role.index, &role.num_prefill,
                  &role.num_decode) != 4 ||
      (std::string(kind) != "prefill" && std::string(kind) != "decode") || role.index < 0 ||
      role.num_prefill < 1 || role.num_decode < 1 ||
      role.index >= (std::string(kind) == "prefill" ? role.num_prefill : role.num_decode)) {
    return InvalidArgumentError(what + "='" + text + "' is not ROLE:I:P:D with I < P or D");
  }
  role.prefill = std::string(kind) == "prefill";
  return role;
}

// This process's place in a --pd front and its links' options, or none: from the
// environment a local instance is started with (kPdRoleEnv, kPdStoreEnv,
// kPdJobEnv), or from --pd-join/--pd-role, reading the front's counts and job id
// from its store (kPdLayoutKey).
struct PdInstance {
  PdRole role;
  serve::PdLinkOptions links;
};

Result<std::optional<PdInstance>> PdInstanceFor(const ServeArgs& args) {
  const char* env_role = std::getenv(kPdRoleEnv);
  const bool local = env_role != nullptr && *env_role != '\0';
  if (!local && args.pd_join.empty()) return std::optional<PdInstance>();
  TESSERA_ASSIGN_OR_RETURN(comm::CommOptions comm, comm::CommOptions::FromEnvironment());
  std::string store_address = args.pd_join, job, role_text;
  if (local) {
    const char* store = std::getenv(kPdStoreEnv);
    const char* job_env = std::getenv(kPdJobEnv);
    if (store == nullptr || job_env == nullptr) {
      return InvalidArgumentError(std::string("a --pd instance needs ") + kPdStoreEnv + " and " +
                                  kPdJobEnv);
    }
    store_address = store;
    job = job_env;
    role_text = env_role;
  }
  TESSERA_ASSIGN_OR_RETURN(comm::HostPort address, comm::ParseHostPort(store_address));
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<comm::TcpStore> tcp,
      comm::TcpStore::Connect(address, comm.cluster_token, Deadline::AfterMs(10'000)));
  if (!local) {  // --pd-join: the front's counts and job id
    TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> layout,
                             tcp->Get(kPdLayoutKey, Deadline::AfterMs(10'000)));
    const std::string text(layout.begin(), layout.end());
    const size_t second = text.find(':', text.find(':') + 1);
    if (second == std::string::npos) {
      return InvalidArgumentError("the --pd front at " + store_address +
                                  " published a malformed layout");
    }
    job = text.substr(second + 1);
    role_text = args.pd_role + ":" + text.substr(0, second);
  }
  PdInstance pd;
  TESSERA_ASSIGN_OR_RETURN(pd.role, ParsePdRole(role_text, local ? kPdRoleEnv : "--pd-role"));
  comm.job_id = job;
  pd.links.store = std::shared_ptr<comm::Store>(std::move(tcp));
  pd.links.comm = std::move(comm);
  pd.links.transfer_timeout_ms = static_cast<int64_t>(args.kv_transfer_timeout_s * 1000);
  pd.links.connect_timeout_ms = std::min<int64_t>(10'000, pd.links.transfer_timeout_ms);
  // Checked by RunServe.
  pd.links.wire = kv::ParseWireType(args.kv_transfer_dtype).value_or(kv::WireType::kRaw);
  return std::optional<PdInstance>(std::move(pd));
}

Status Drive(const ServeArgs& args, const comm::RankEnv& env, const engine::RuntimeOptions& options,
             RankSetup& setup, const sigset_t& watched_signals) {
  const model::GgufFile& file = *setup.file;
  TESSERA_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::FromGguf(file));
  std::string chat_error;
  std::unique_ptr<serve::ChatTemplate> chat = LoadChatTemplate(args, file, tokenizer, &chat_error);
  if (!chat) std::fprintf(stderr, "tessera serve: chat disabled: %s\n", chat_error.c_str());

  serve::Metrics metrics;
  DriverEngine engine;
  engine.driver = std::make_unique<engine::Driver>(*setup.runner);
  engine.metered =
      std::make_unique<serve::MeteredExecutor>(*engine.driver, setup.runner->groups(), metrics);
  engine.metered->SetRunner(setup.runner.get());
  engine.metered->SetReportSource(engine.driver.get());
  engine.metered->SetRebalancer(MakeRebalancer(args, setup.runner->plan()));
  // The live view's first sample of the ranks, before any request.
  if (Status polled = engine.metered->PollReports(); !polled.ok()) {
    Status shutdown = engine.driver->Shutdown().status();
    return polled;
  }
  engine::SchedulerOptions scheduler_options = args.scheduler;
  scheduler_options.enable_prefix_cache = !args.no_prefix_cache;
  Status valid =
      ApplySpeculativeFlags(args.speculative, tokenizer, setup.threads, scheduler_options);
  if (valid.ok()) valid = engine::ValidateSchedulerOptions(scheduler_options, *engine.metered);
  if (!valid.ok()) {
    Status shutdown = engine.driver->Shutdown().status();
    return valid;
  }
  // Prefill/decode disaggregation: this process is one instance of a --pd front.
  Result<std::optional<PdInstance>> pd_instance = PdInstanceFor(args);
  Status usable = pd_instance.status();
  const parallel::Partition& plan = setup.plan;
  if (usable.ok() && *pd_instance && (plan.pp > 1 || plan.cp > 1 || plan.dp > 1)) {
    usable = InvalidArgumentError(
        "a --pd instance runs on one rank or over tensor-parallel ranks (--tp, "
        "--prefill-tp, --decode-tp), not yet --pp, --cp or --dp-attention: " +
        plan.ToString());
  }
  serve::PdCache pd_cache;  // one rank: in place; several: through the executor
  if (usable.ok() && *pd_instance) {
    kv::KvCache& cache = setup.runner->mutable_cache();
    pd_cache = {.shape = cache.shape(), .local = &cache};
    if (plan.world_size() > 1) {
      Result<kv::KvCacheShape> whole = engine.metered->whole_kv_shape();
      usable = whole.status();
      if (whole.ok()) pd_cache = {.shape = *whole};
    }
  }
  if (!usable.ok()) {
    Status shutdown = engine.driver->Shutdown().status();
    return usable;
  }
  std::optional<PdRole> pd;
  serve::PdLinkOptions pd_options;
  std::unique_ptr<serve::KvImportLinks> importer;
  std::atomic<engine::Scheduler*> import_sink{nullptr};
  if (*pd_instance) {
    pd = (*pd_instance)->role;
    pd_options = std::move((*pd_instance)->links);
    if (!pd->prefill) {
      importer = std::make_unique<serve::KvImportLinks>(
          pd_cache, pd->index, pd->num_prefill, pd_options,
          [&import_sink](int64_t id, Status status, int64_t bytes, int64_t prefilled_ns,
                         int64_t streamed_bytes) {
            if (engine::Scheduler* sink = import_sink.load()) {
              sink->ImportDone(id, std::move(status), bytes, prefilled_ns, streamed_bytes);
            }
          });
      scheduler_options.kv_importer = importer.get();
    }
  }
  engine::Scheduler scheduler(*engine.metered, tokenizer, scheduler_options);
  import_sink.store(&scheduler);
  std::unique_ptr<serve::KvExportLinks> exporter;
  if (pd && pd->prefill) {
    exporter = std::make_unique<serve::KvExportLinks>(pd_cache, scheduler, pd->index,
                                                      pd->num_decode, pd_options);
  }
  // The links go before the scheduler they report to.
  struct LinksGuard {
    std::unique_ptr<serve::KvExportLinks>& exporter;
    std::unique_ptr<serve::KvImportLinks>& importer;
    ~LinksGuard() {
      exporter.reset();
      importer.reset();
    }
  } links_guard{exporter, importer};
  const bool supervised = env.supervisor_pid > 0 && setup.plan.world_size() > 1;
  EngineRestarter restarter(args, env, options, setup, engine, metrics);
  if (supervised) {
    scheduler.SetRecovery(
        [&restarter](const Status& failure) { return restarter.Recover(failure); },
        static_cast<int64_t>(args.unavailable_after_s * 1000));
  }
  serve::ServerOptions server_options = args.server;
  if (setup.plan.world_size() > 1) server_options.plan = setup.plan.ToString();
  serve::OpenAiServer server(scheduler, tokenizer, chat.get(), chat_error, metrics, server_options);
  Result<int> port = server.Bind();
  if (port.ok()) {
    if (Status written = WriteReplicaPortFile(*port); !written.ok()) port = written;
  }
  if (!port.ok()) {
    Status shutdown = engine.driver->Shutdown().status();
    return port.status();
  }

  Status run_status;
  std::thread scheduler_thread([&] {
    run_status = scheduler.Run();
    if (!run_status.ok()) server.Stop();  // the engine failed for good: nothing left to serve
  });
  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    const timespec poll = {0, 200'000'000};
    while (!done.load()) {
      siginfo_t info{};
      const int sig = sigtimedwait(&watched_signals, &info, &poll);
      if (sig == comm::kEpochStartedSignal && supervised) {
        const int epoch = info.si_value.sival_int;
        if (restarter.OnEpochStarted(epoch)) {
          scheduler.RequestRecovery(UnavailableError(
              "the launcher restarted the other ranks (epoch " + std::to_string(epoch) + ")"));
        }
      } else if (sig == SIGINT || sig == SIGTERM) {
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
  const std::string role =
      pd ? std::string(pd->prefill ? ", prefill instance " : ", decode instance ") +
               std::to_string(pd->index)
         : "";
  std::fprintf(stderr, "tessera serve: %s on http://%s:%d (%s, max model len %lld%s%s)\n",
               args.server.model_name.c_str(), args.server.host.c_str(), *port,
               setup.plan.ToString().c_str(), static_cast<long long>(scheduler.max_model_len()),
               supervised ? ", ranks supervised" : "", role.c_str());
  Status serve_status = server.Serve();
  scheduler.Stop(/*cancel_in_flight=*/true);
  scheduler_thread.join();
  exporter.reset();
  importer.reset();
  done.store(true);
  signal_thread.join();
  TESSERA_RETURN_IF_ERROR(run_status);
  Result<std::vector<engine::RankReport>> reports = engine.driver->Shutdown();
  TESSERA_RETURN_IF_ERROR(serve_status);
  return reports.status();
}

// Every thread (the compute pool, comm progress, HTTP) inherits the blocked stop
// signals; only a watcher thread takes them.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, comm::kEpochStartedSignal);  // from a supervising launcher
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a signal
  return stop_signals;
}

// `--dp N` / `--replica URL`: this process is the front; the replicas are copies
// of this command line (serve_front.h).
Status RunFront(const ServeArgs& args) {
  FrontArgs front;
  front.dp = args.dp;
  if (!args.pd.empty()) {
    TESSERA_ASSIGN_OR_RETURN(const auto counts, ParsePdCounts(args.pd));
    if (args.dp > 0 || !args.replicas.empty()) {
      return InvalidArgumentError(
          "--pd has its own instances: no --dp or --replica with it (--pd-prefill and "
          "--pd-decode add instances elsewhere)");
    }
    front.pd_prefill = counts.first;
    front.pd_decode = counts.second;
    front.pd_prefill_urls = args.pd_prefill_urls;
    front.pd_decode_urls = args.pd_decode_urls;
    front.pd_store = args.pd_store;
    if (front.num_prefill() < 1 || front.num_decode() < 1) {
      return InvalidArgumentError(
          "--pd needs at least one prefill and one decode instance, "
          "local (P:D) or elsewhere (--pd-prefill, --pd-decode)");
    }
    front.options.first_routable = front.num_prefill();
  }
  front.replicas = args.replicas;
  front.options.server = args.server;
  TESSERA_ASSIGN_OR_RETURN(front.options.policy, serve::RouterPolicyFromName(args.router));
  if (args.router_load_margin < 0) {
    return InvalidArgumentError("--router-load-margin must be >= 0");
  }
  front.options.load_margin = args.router_load_margin;
  front.options.unavailable_after_ms = static_cast<int64_t>(args.unavailable_after_s * 1000);
  const sigset_t stop_signals = BlockStopSignals();
  TESSERA_ASSIGN_OR_RETURN(model::GgufFile file, model::OpenModelFile(args.model_path));
  TESSERA_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::FromGguf(file));
  std::string chat_error;
  std::unique_ptr<serve::ChatTemplate> chat = LoadChatTemplate(args, file, tokenizer, &chat_error);
  return RunServeFront(front, tokenizer, chat.get(), stop_signals);
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
  TESSERA_RETURN_IF_ERROR(ValidateSpeculativeFlags(args.speculative));  // before any rank starts
  if (args.dp < 0) return InvalidArgumentError("--dp must be >= 1");
  if (!kv::ParseWireType(args.kv_transfer_dtype)) {
    return InvalidArgumentError("--kv-transfer-dtype must be f16, q8_0, fp8_e4m3 or mxfp8, not '" +
                                args.kv_transfer_dtype + "'");
  }
  if (args.kv_transfer_timeout_s <= 0) {
    return InvalidArgumentError("--kv-transfer-timeout-s must be > 0");
  }
  if (args.ep_rebalance_s > 0 && (args.parallel.ep < 2 || args.parallel.ep_redundant < 1)) {
    return InvalidArgumentError(
        "--ep-rebalance moves copies of hot experts between ranks: it needs --ep 2 or more "
        "and --ep-redundant 1 or more (slots for the copies)");
  }
  if (args.parallel.dp_attention) {
    // One group whose ranks are the dp ranks (parallel::PartitionRequest::dp), not
    // replicas behind a front.
    if (args.dp > 1 && args.dp != args.parallel.ep) {
      return InvalidArgumentError(
          "--dp-attention runs --dp N as the N ranks of one group that "
          "split the experts: --dp (" +
          std::to_string(args.dp) + ") must equal --ep (" + std::to_string(args.parallel.ep) + ")");
    }
    if (!args.replicas.empty() || !args.pd.empty()) {
      return InvalidArgumentError("--dp-attention is one rank group: not with --replica or --pd");
    }
    args.dp = 0;
  }
  if (args.pd_join.empty() != args.pd_role.empty()) {
    return InvalidArgumentError("--pd-join and --pd-role go together");
  }
  if (args.pd.empty() && (!args.pd_prefill_urls.empty() || !args.pd_decode_urls.empty() ||
                          !args.pd_store.empty() || args.prefill_tp != 0 || args.decode_tp != 0)) {
    return InvalidArgumentError(
        "--pd-prefill, --pd-decode, --pd-store, --prefill-tp and --decode-tp go with --pd P:D");
  }
  if (args.prefill_tp < 0 || args.decode_tp < 0) {
    return InvalidArgumentError("--prefill-tp and --decode-tp must be >= 1");
  }
  if (!args.pd_role.empty()) {  // its index is checked against the front's counts later
    char kind[16] = {}, extra = 0;
    int index = -1;
    if (std::sscanf(args.pd_role.c_str(), "%15[a-z]:%d%c", kind, &index, &extra) != 2 ||
        (std::string(kind) != "prefill" && std::string(kind) != "decode") || index < 0) {
      return InvalidArgumentError("--pd-role '" + args.pd_role +
                                  "' is not prefill:I or decode:I (I >= 0)");
    }
  }
  if (!args.pd_join.empty() && (!args.pd.empty() || args.dp > 1 || !args.replicas.empty())) {
    return InvalidArgumentError(
        "--pd-join makes this one instance of a front elsewhere: no "
        "--pd, --dp or --replica with it");
  }
  const char* port_file = std::getenv(kReplicaPortFileEnv);
  if (port_file != nullptr && *port_file != '\0') {  // a replica of a front: loopback, any port
    args.server.host = "127.0.0.1";
    args.server.port = 0;
    // A local --pd instance: its role's tp (its ranks, started below, do the same).
    const char* role = std::getenv(kPdRoleEnv);
    if (role != nullptr && *role != '\0') {
      const int tp = std::string(role).starts_with("prefill") ? args.prefill_tp : args.decode_tp;
      if (tp > 0) args.parallel.tp = tp;
    }
  } else if (!args.pd.empty()) {
    return RunFront(args);
  } else if (args.dp > 1 || !args.replicas.empty()) {
    return RunFront(args);
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
  // Only the driver's watcher thread takes the stop signals; workers leave them
  // blocked and stop when the driver says so.
  const sigset_t stop_signals = BlockStopSignals();

  {
    TESSERA_ASSIGN_OR_RETURN(model::GgufFile probe, model::OpenModelFile(args.model_path));
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
  if (args.whole_prompt_steps) {
    args.scheduler.max_num_batched_tokens =
        std::max(args.scheduler.max_num_batched_tokens, args.scheduler.max_model_len);
  }
  options.max_step_tokens = args.scheduler.max_num_batched_tokens;
  options.max_step_sequences = args.scheduler.max_num_seqs;
  args.scheduler.max_model_len = std::min(args.scheduler.max_model_len, options.kv_capacity_tokens);
  if (args.model_name.empty()) args.model_name = FileStem(args.model_path);
  args.server.model_name = args.model_name;

  ParallelFlags flags = args.parallel;
  flags.threads = args.threads;
  return RunRank(args.model_path, flags, env, options,
                 [&](RankSetup& setup) { return Drive(args, env, options, setup, stop_signals); });
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)");
  cmd->add_option("model", args->model_path, "GGUF model file or Hugging Face checkpoint directory")
      ->required();
  cmd->add_option("--host", args->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->server.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", args->server.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (default: $TESSERA_API_KEY)")
      ->envname("TESSERA_API_KEY");
  cmd->add_option("--served-model-name", args->model_name,
                  "Model id clients name (default: the file name without .gguf)");
  cmd->add_option(
      "--chat-template", args->chat_template,
      "Chat format: llama-2, llama-3, chatml, mistral, zephyr or plain, or a Jinja template "
      "text to recognise (default: the model's tokenizer.chat_template)");
  cmd->add_option("--max-num-seqs", args->scheduler.max_num_seqs, "Sequences running at once")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", args->scheduler.max_num_batched_tokens,
                  "New tokens per step (decodes + prefill chunks; under --cp default "
                  "--max-model-len, a whole prompt a step)")
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
  cmd->add_option("--prefix-wait-tokens", args->scheduler.prefix_wait_min_tokens,
                  "A request whose next prompt blocks (this many tokens at least) another "
                  "request is computing waits a step to take them from the cache; 0: never")
      ->capture_default_str();
  // On these CPUs a prefill of a few dozen tokens is compute-bound already: prompts
  // that arrive together gain nothing from one step, and each waits for all.
  args->scheduler.admit_prefill_tokens = 64;
  cmd->add_option("--admit-prefill-tokens", args->scheduler.admit_prefill_tokens,
                  "A step admits waiting requests until their prompt tokens reach this many "
                  "(the first always; 0: as many as --max-num-batched-tokens allows)")
      ->capture_default_str();
  cmd->add_option("--short-prompt-tokens", args->scheduler.short_prompt_tokens,
                  "Waiting requests whose whole prompt fits in this many tokens (at most half "
                  "of --max-num-batched-tokens) start before a running long prompt's next "
                  "chunk; 0: strict first-come admission")
      ->capture_default_str();
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
  cmd->add_flag_function(
      "--no-ui", [args](int64_t) { args->server.ui = false; },
      "No live view: GET / and /ui/* answer 404 (the API, /health and /metrics stay)");
  AddSpeculativeFlags(cmd, &args->speculative, /*server=*/true);
  AddParallelFlags(cmd, &args->parallel);
  args->parallel.max_restarts = 10;
  cmd->add_option("--max-restarts", args->parallel.max_restarts,
                  "Restarts of the other ranks after one dies or freezes (local jobs; the "
                  "HTTP front stays up, requests wait and resume; 0 = a failure stops the server)")
      ->capture_default_str();
  cmd->add_option("--unavailable-after-s", args->unavailable_after_s,
                  "While the ranks restart (or, with --dp, no replica is up), new requests "
                  "wait for this long, then get 503")
      ->capture_default_str();
  cmd->add_option("--ep-rebalance", args->ep_rebalance_s,
                  "Seconds between live re-placements of hot-expert copies from the measured "
                  "load (--ep with --ep-redundant; default 10, 0: keep the start placement)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--ep-rebalance-min-rows", args->ep_rebalance_min_rows,
                  "(token, choice) rows a window needs before --ep-rebalance judges it")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dp", args->dp,
                  "Data parallelism: this process is an HTTP front over N replicas it starts "
                  "(each an ordinary serve group with the other flags: --tp, --pp, -t, …), "
                  "restarting any that dies; with --ep N --dp-attention, the N ranks of one "
                  "group instead (data-parallel attention, experts split over them)");
  cmd->add_option("--replica", args->replicas,
                  "A replica elsewhere (http://HOST:PORT, a `tessera serve` there) for the "
                  "front to route to; repeatable, with or without --dp");
  cmd->add_option("--router", args->router,
                  "Data-parallel routing: round-robin, least-outstanding or prefix-affinity")
      ->capture_default_str();
  cmd->add_option("--router-load-margin", args->router_load_margin,
                  "prefix-affinity: requests by which the replica with the longest cached "
                  "prefix may exceed the least-loaded one before the latter is chosen")
      ->capture_default_str();
  cmd->add_option("--pd", args->pd,
                  "Prefill/decode disaggregation: P:D — this process is the HTTP front over P "
                  "prefill and D decode instances it starts (one rank each, or --tp / "
                  "--prefill-tp / --decode-tp ranks); prompts are "
                  "computed on a prefill instance and their KV blocks sent to a decode instance "
                  "over tessera::comm (docs/pd.md)");
  cmd->add_option("--pd-prefill", args->pd_prefill_urls,
                  "--pd: a prefill instance elsewhere (http://HOST:PORT, a `tessera serve "
                  "--pd-join` there); repeatable; P of --pd P:D may then be 0");
  cmd->add_option("--pd-decode", args->pd_decode_urls,
                  "--pd: a decode instance elsewhere (http://HOST:PORT); repeatable");
  cmd->add_option("--pd-store", args->pd_store,
                  "--pd: where the KV links' rendezvous store listens, HOST:PORT (default "
                  "loopback, any port); instances elsewhere join it with --pd-join");
  cmd->add_option("--prefill-tp", args->prefill_tp,
                  "--pd: tensor-parallel ranks of each local prefill instance (default --tp); "
                  "KV blocks travel whole, so prefill and decode tp may differ");
  cmd->add_option("--decode-tp", args->decode_tp,
                  "--pd: tensor-parallel ranks of each local decode instance (default --tp)");
  cmd->add_option("--pd-join", args->pd_join,
                  "Run as one instance of the --pd front whose store is at HOST:PORT "
                  "(TESSERA_CLUSTER_TOKEN as on the front); with --pd-role");
  cmd->add_option("--pd-role", args->pd_role,
                  "With --pd-join: prefill:I or decode:I, this instance's place among the "
                  "front's (the I-th --pd-prefill/--pd-decode URL, after its local ones)");
  cmd->add_option(
      "--kv-transfer-dtype", args->kv_transfer_dtype,
      "--pd: what KV blocks travel in — f16, q8_0, fp8_e4m3 or mxfp8 (lossy: the decode's "
      "logits move slightly, docs/pd.md); default the cache's own dtype "
      "(bit-identical to a colocated run)");
  cmd->add_option("--kv-transfer-timeout-s", args->kv_transfer_timeout_s,
                  "--pd: a KV transfer not done within this fails (the decode instance then "
                  "computes the prompt itself)")
      ->capture_default_str();
  cmd->callback([cmd, args, exit_code] {
    args->whole_prompt_steps = args->parallel.cp > 1 && cmd->count("--max-num-batched-tokens") == 0;
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
