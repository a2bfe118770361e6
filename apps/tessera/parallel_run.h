// How a CLI command runs as a tensor/pipeline-parallel job: the --tp/--pp/
// --nnodes/… flags, starting the local rank processes when no launcher did, and
// setting up one rank (world, groups, plan, its shard and KV cache). `tessera
// generate` (and later `serve`) use it. Layer: apps.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "comm/rank_env.h"
#include "engine/stage_runner.h"
#include "model/config.h"
#include "model/gguf.h"
#include "parallel/partition.h"

namespace tessera::cli {

struct ParallelFlags {
  int tp = 1;
  int ep = 1;  // expert-parallel ranks: a stage's tp ranks (--ep alone sets tp = ep)
  // Data-parallel attention: the ep ranks each run their own sequences' attention
  // (tp 1), the experts spread over them (parallel::PartitionRequest::dp).
  bool dp_attention = false;
  int ep_redundant = 0;      // replica expert slots per EP rank
  std::string ep_placement;  // JSON file: every expert's holders (parallel/expert_placement.h)
  int pp = 1;
  std::string pp_layers;
  int cp = 1;  // context-parallel ranks: each sequence's KV spans spread over them
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv;
  std::string token;
  bool insecure_no_token = false;
  bool tls = false;  // TLS 1.3 on TCP links between ranks (TESSERA_TCP_TLS)
  std::string transport = "auto";
  bool fast = false;  // the library's fastest all-reduce instead of the deterministic one
  bool sp = false;    // sequence parallelism over the tp ranks
  int64_t sp_min_tokens = parallel::kDefaultSpMinTokens;
  int64_t timeout_ms = 0;
  int threads = 0;  // per rank; 0 = this node's cores / its ranks
  // Rank supervision (serve): restarts of the other ranks after a failure, at
  // most this many over the job (comm::LaunchSpec::max_restarts); 0 = none.
  int max_restarts = 0;

  int tp_ranks() const { return tp == 1 && ep > 1 && !dp_attention ? ep : tp; }
  int dp_ranks() const { return dp_attention ? ep : 1; }
  int world_size() const { return tp_ranks() * cp * dp_ranks() * pp; }
  // The plan these flags ask for; reads the --ep-placement file.
  Result<parallel::PartitionRequest> Request() const;
};

void AddParallelFlags(CLI::App* cmd, ParallelFlags* flags);

// The model's configuration, once the --tp/--pp plan is known to fit it (heads,
// layers, vocabulary): the check every rank would make, made once before any rank
// starts. Reads the GGUF's metadata only.
Result<model::ModelConfig> CheckPlanFitsModel(const std::string& model_path,
                                              const ParallelFlags& flags);

// When the job has several ranks and no launcher started this process, checks the
// plan against the model (CheckPlanFitsModel), starts this node's ranks as copies
// of this command and returns the job's exit code; nullopt when this process is
// itself a rank (or the only one).
Result<std::optional<int>> LaunchRanksIfNeeded(const std::string& model_path,
                                               const ParallelFlags& flags,
                                               const comm::RankEnv& env);

// One rank, ready to run: its communicators, the validated plan, its shard of the
// model and its KV cache.
struct RankSetup {
  comm::World world;  // empty for a job of one rank
  parallel::Partition plan;
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<engine::StageRunner> runner;
  int threads = 1;
};

// Validates the plan against the model before reading any weight, then connects
// (InitWorld, groups) and binds the shard.
Result<RankSetup> SetUpRank(const std::string& model_path, const ParallelFlags& flags,
                            const comm::RankEnv& env, const engine::RuntimeOptions& options);

// SetUpRank, then the driver runs `drive` and every other rank serves steps until
// the driver's stop. A rank that fails aborts its groups (waking every peer that
// waits on it) and returns the error prefixed with its rank.
Status RunRank(const std::string& model_path, const ParallelFlags& flags, const comm::RankEnv& env,
               const engine::RuntimeOptions& options,
               const std::function<Status(RankSetup& setup)>& drive);

// The per-rank report table: shard, KV and resident memory, and where decode
// (and prefill) time went — computing, communicating, waiting.
std::string FormatRankReports(const std::vector<engine::RankReport>& reports,
                              const parallel::Partition& plan);

}  // namespace tessera::cli
