#include "apps/tessera/parallel_run.h"

#include <fstream>
#include <iterator>
#include <thread>

#include "apps/tessera/cli_util.h"
#include "base/env.h"
#include "comm/launcher.h"
#include "engine/worker.h"
#include "model/hf_checkpoint.h"
#include "model/shard.h"

namespace tessera::cli {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

std::string Mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string Share(const engine::TimeShare& t) {
  const int64_t total = t.compute_ns + t.comm_ns + t.wait_ns;
  if (t.steps == 0 || total <= 0) return "      -";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%6lld %5.1f ms %5.1f%% %5.1f%% %5.1f%%",
                static_cast<long long>(t.steps), total * 1e-6 / t.steps,
                100.0 * t.compute_ns / total, 100.0 * t.comm_ns / total, 100.0 * t.wait_ns / total);
  return buf;
}

}  // namespace

Result<parallel::PartitionRequest> ParallelFlags::Request() const {
  parallel::PartitionRequest request{.tp = tp_ranks(),
                                     .pp = pp,
                                     .cp = cp,
                                     .ep = ep,
                                     .dp = dp_ranks(),
                                     .pp_layers = pp_layers,
                                     .sp = sp,
                                     .sp_min_tokens = sp_min_tokens,
                                     .ep_redundant = ep_redundant};
  if (!ep_placement.empty()) {
    std::ifstream in(ep_placement);
    if (!in) return NotFoundError("--ep-placement: cannot read " + ep_placement);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<parallel::ExpertPlacement> placement = parallel::ParseExpertPlacement(text);
    if (!placement.ok()) return placement.status().WithContext("--ep-placement " + ep_placement);
    request.expert_placement = *std::move(placement);
  }
  return request;
}

void AddParallelFlags(CLI::App* cmd, ParallelFlags* f) {
  cmd->add_option("--tp", f->tp, "Tensor-parallel ranks (split heads, FFN rows, vocabulary)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ep", f->ep,
                  "Expert-parallel ranks: on MoE layers each of a stage's tp ranks holds "
                  "num_experts/ep whole experts (must divide --tp; --ep alone sets --tp)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--dp-attention", f->dp_attention,
                "With --ep N on an MoE model: N ranks, each running the attention of its own "
                "sequences over its own KV cache (data parallel), the experts spread over them "
                "(tokens dispatched and combined by all-to-allv); the same logits");
  cmd->add_flag("--sp", f->sp,
                "Sequence parallelism (with --tp >= 2, dense models): a step's tokens split "
                "over the tp ranks for the norms and residual; reduce-scatter + all-gather "
                "instead of all-reduce, the same logits");
  cmd->add_option("--sp-min-tokens", f->sp_min_tokens,
                  "Steps with fewer new tokens run plain tensor parallel (the same bits)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ep-redundant", f->ep_redundant,
                  "Replica expert slots per EP rank, for --ep-placement (hot experts held by "
                  "several ranks, their tokens spread over them; the same logits)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--ep-placement", f->ep_placement,
                  "JSON file {\"experts\": [[ranks], ...]}: the EP ranks holding each expert "
                  "(generate --ep-placement-out writes one balanced for a measured load)");
  cmd->add_option("--pp", f->pp, "Pipeline stages (contiguous layer ranges)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cp", f->cp,
                  "Context-parallel ranks: every sequence's KV spans (256 positions) spread "
                  "zig-zag over them, a whole prompt's rows split over them (ring-free: one "
                  "K/V all-gather a layer), decode attention reduced over them; the same logits")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pp-layers", f->pp_layers,
                  "Stage layer ranges, e.g. 0-10,11-21 (default: balanced by weight bytes)");
  cmd->add_option("--nnodes", f->nnodes, "Nodes of the job (run this command once per node)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", f->node_rank, "This node's index (node 0 hosts the rendezvous)");
  cmd->add_option("--rdzv", f->rdzv, "Rendezvous HOST:PORT (needed with --nnodes > 1)");
  cmd->add_option("--token", f->token,
                  "Cluster token (default: $TESSERA_CLUSTER_TOKEN); peers without it are refused");
  cmd->add_flag("--insecure-no-token", f->insecure_no_token,
                "Let ranks listen beyond loopback without a cluster token (anyone who reaches "
                "the ports can join; refused otherwise)");
  cmd->add_flag("--tls", f->tls,
                "TLS 1.3 on every TCP link between ranks (encrypted, forward secret; keyed by "
                "the cluster token, no certificates); shared memory stays as it is");
  cmd->add_option("--transport", f->transport,
                  "auto|shm|tcp|mpi between ranks (mpi: under mpirun/srun)")
      ->capture_default_str();
  cmd->add_flag("--fast", f->fast,
                "Use the fastest all-reduce (ring / recursive doubling) instead of the "
                "deterministic one; logits may differ from one rank's in the last bits");
  cmd->add_option("--timeout-ms", f->timeout_ms,
                  "Deadline of every communication (0 = default); a dead peer fails sooner");
}

Result<model::ModelConfig> CheckPlanFitsModel(const std::string& model_path,
                                              const ParallelFlags& flags) {
  TESSERA_ASSIGN_OR_RETURN(model::GgufFile file, model::OpenModelFile(model_path));
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfigFromGguf(file));
  TESSERA_ASSIGN_OR_RETURN(const parallel::PartitionRequest request, flags.Request());
  TESSERA_RETURN_IF_ERROR(model::PartitionForModel(file, config, request).status());
  return config;
}

Result<std::optional<int>> LaunchRanksIfNeeded(const std::string& model_path,
                                               const ParallelFlags& flags,
                                               const comm::RankEnv& env) {
  if (env.source != "none" || (flags.world_size() == 1 && flags.nnodes == 1)) {
    return std::optional<int>();
  }
  TESSERA_RETURN_IF_ERROR(CheckPlanFitsModel(model_path, flags).status());
  if (flags.world_size() % flags.nnodes != 0) {
    return InvalidArgumentError("--tp x --cp x --pp (" + S(flags.world_size()) +
                                " ranks) must divide evenly over --nnodes " + S(flags.nnodes));
  }
  if (flags.nnodes > 1 && flags.rdzv.empty()) {
    return InvalidArgumentError("--nnodes " + S(flags.nnodes) + " needs --rdzv HOST:PORT");
  }
  comm::LaunchSpec spec;
  spec.argv = OwnCommandLine();
  spec.nproc_per_node = flags.world_size() / flags.nnodes;
  spec.nnodes = flags.nnodes;
  spec.node_rank = flags.node_rank;
  spec.cluster_token = flags.token.empty() ? EnvStringOr("TESSERA_CLUSTER_TOKEN", "") : flags.token;
  spec.insecure_no_token = flags.insecure_no_token;
  if (flags.tls) spec.extra_env.push_back({"TESSERA_TCP_TLS", "1"});
  // Supervision on every node: the driver's node restarts, the others follow.
  spec.max_restarts = flags.max_restarts;
  parallel::Partition degrees;
  degrees.tp = flags.tp_ranks();
  degrees.pp = flags.pp;
  degrees.cp = flags.cp;
  degrees.dp = flags.dp_ranks();
  // -1 on the nodes without the driver.
  spec.driver_local_rank = degrees.driver_rank() - flags.node_rank * spec.nproc_per_node;
  if (spec.driver_local_rank >= spec.nproc_per_node) spec.driver_local_rank = -1;
  if (!flags.rdzv.empty()) {
    TESSERA_ASSIGN_OR_RETURN(spec.rdzv, comm::ParseHostPort(flags.rdzv));
  }
  TESSERA_ASSIGN_OR_RETURN(int code, comm::LaunchLocalRanks(spec));
  return std::optional<int>(code);
}

Result<RankSetup> SetUpRank(const std::string& model_path, const ParallelFlags& flags,
                            const comm::RankEnv& env, const engine::RuntimeOptions& options) {
  if (env.world_size != flags.world_size()) {
    return InvalidArgumentError("the launcher started " + S(env.world_size) + " ranks; --tp " +
                                S(flags.tp_ranks()) + " x --cp " + S(flags.cp) + " x --dp " +
                                S(flags.dp_ranks()) + " x --pp " + S(flags.pp) + " needs " +
                                S(flags.world_size()));
  }
  RankSetup setup;
  TESSERA_ASSIGN_OR_RETURN(model::GgufFile file, model::OpenModelFile(model_path));
  setup.file = std::make_unique<model::GgufFile>(std::move(file));
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfigFromGguf(*setup.file));
  // The plan is checked against the model before anything connects or loads.
  TESSERA_ASSIGN_OR_RETURN(setup.plan,
                           model::PartitionForModel(*setup.file, config, *flags.Request()));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  setup.threads = flags.threads > 0 ? flags.threads : std::max(1, cores / env.local_world_size);
  setup.pool = std::make_unique<ThreadPool>(setup.threads);
  parallel::Groups groups;
  if (flags.world_size() > 1) {
    TESSERA_ASSIGN_OR_RETURN(comm::CommOptions comm_options, comm::CommOptions::FromEnvironment());
    if (flags.transport != "auto") {
      auto kind = comm::ParseTransportKind(flags.transport);
      if (!kind) return InvalidArgumentError("--transport must be auto, shm, tcp or mpi");
      comm_options.transport = *kind;
    }
    if (flags.timeout_ms > 0) comm_options.timeout_ms = flags.timeout_ms;
    if (!flags.token.empty()) comm_options.cluster_token = flags.token;
    if (flags.insecure_no_token) comm_options.insecure_no_token = true;
    if (flags.tls) comm_options.tcp_tls = true;
    TESSERA_ASSIGN_OR_RETURN(setup.world, comm::InitWorld(env, comm_options));
    TESSERA_ASSIGN_OR_RETURN(groups, parallel::MakeGroups(*setup.world.comm, setup.plan));
  }
  TESSERA_ASSIGN_OR_RETURN(setup.runner,
                           engine::StageRunner::Create(setup.plan, env.rank, std::move(groups),
                                                       *setup.file, *setup.pool, options));
  return setup;
}

Status RunRank(const std::string& model_path, const ParallelFlags& flags, const comm::RankEnv& env,
               const engine::RuntimeOptions& options,
               const std::function<Status(RankSetup& setup)>& drive) {
  TESSERA_ASSIGN_OR_RETURN(RankSetup setup, SetUpRank(model_path, flags, env, options));
  Status status = setup.runner->is_driver() ? drive(setup) : engine::ServeWorker(*setup.runner);
  if (status.ok()) return status;
  const std::string rank = "rank " + std::to_string(env.rank);
  // (A driver whose engine restart failed has no runner left.)
  if (setup.runner) setup.runner->groups().Abort(rank + " failed: " + status.message());
  if (setup.world.comm) setup.world.comm->Abort(status.message());
  return status.WithContext(rank);
}

std::string FormatRankReports(const std::vector<engine::RankReport>& reports,
                              const parallel::Partition& plan) {
  std::string out =
      "rank stage tp cp  weights MiB   KV MiB  act MiB  peak RSS MiB | decode steps  per step  "
      "compute  comm   wait | prefill steps per step  compute  comm   wait | links to ranks 0..\n";
  for (const engine::RankReport& r : reports) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%4d %5d %2d %2d %12s %8s %8s %13s |", r.rank, r.stage,
                  r.tp_rank, plan.CpRankOf(r.rank), Mib(r.weight_bytes).c_str(),
                  Mib(r.kv_bytes).c_str(), Mib(r.activation_bytes).c_str(),
                  Mib(r.peak_rss_bytes).c_str());
    out += buf + (" " + Share(r.decode)) + " | " + Share(r.prefill) + " | " + r.links + "\n";
  }
  out +=
      "(compute: kernels; comm: all-reduces, gathers and sends, including waits for slower "
      "peers inside them; wait: idle for the upstream stage)\n";
  // MoE load: the (token, choice) rows routed to each expert in each rank's layers
  // (under --ep: over its EP group's tokens), all steps.
  for (const engine::RankReport& r : reports) {
    int64_t total = 0;
    std::string line;
    for (size_t e = 0; e < r.expert_rows_total.size(); ++e) {
      line += " " + S(r.expert_rows_total[e]);
      total += r.expert_rows_total[e];
    }
    if (total == 0) continue;
    out += "rank " + S(r.rank) + " expert rows (per expert, its layers, all steps):" + line +
           " = " + S(total) + "\n";
  }
  return out;
}

}  // namespace tessera::cli
