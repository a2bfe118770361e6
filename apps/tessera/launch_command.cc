// `tessera launch`: starts this node's ranks of a job with the torchrun-style
// environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, TESSERA_RDZV, TESSERA_JOB_ID), hosting the rendezvous store on
// node 0. Across machines run it once per node with the same --rdzv.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/tessera/commands.h"
#include "base/env.h"
#include "comm/launcher.h"

namespace tessera::cli {

void AddLaunchCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Start N local ranks of CMD (torchrun convention); multi-node: one launch per node");
  struct Flags {
    int nproc = 1;
    int nnodes = 1;
    int node_rank = 0;
    std::string rdzv;
    std::string job_id;
    std::string token;
    bool insecure_no_token = false;
    bool tls = false;
    std::vector<std::string> command;
  };
  auto flags = std::make_shared<Flags>();
  cmd->add_option("--nproc,--nproc-per-node", flags->nproc, "Ranks to start on this node")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", flags->nnodes, "Number of nodes")->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", flags->node_rank, "This node's index (0 hosts the store)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rdzv,--rdzv-endpoint", flags->rdzv,
                  "HOST:PORT of the rendezvous store (node 0 listens there)");
  cmd->add_option("--job-id", flags->job_id, "Job id (default: random, chosen by node 0)");
  cmd->add_option("--token", flags->token,
                  "Cluster token (default: $TESSERA_CLUSTER_TOKEN); peers without it are refused");
  cmd->add_flag("--insecure-no-token", flags->insecure_no_token,
                "Let ranks listen beyond loopback without a cluster token (anyone who reaches "
                "the ports can join; refused otherwise)");
  cmd->add_flag("--tls", flags->tls,
                "TLS 1.3 on every TCP link between the ranks (sets TESSERA_TCP_TLS=1 for them)");
  cmd->add_option("command", flags->command, "The command each rank runs (after --)")->required();
  cmd->callback([flags, exit_code] {
    comm::LaunchSpec spec;
    spec.argv = flags->command;
    spec.nproc_per_node = flags->nproc;
    spec.nnodes = flags->nnodes;
    spec.node_rank = flags->node_rank;
    spec.job_id = flags->job_id;
    spec.insecure_no_token = flags->insecure_no_token;
    if (flags->tls) spec.extra_env.push_back({"TESSERA_TCP_TLS", "1"});
    spec.cluster_token =
        flags->token.empty() ? EnvStringOr("TESSERA_CLUSTER_TOKEN", "") : flags->token;
    if (!flags->rdzv.empty()) {
      auto hp = comm::ParseHostPort(flags->rdzv);
      if (!hp.ok()) {
        std::fprintf(stderr, "tessera launch: %s\n", hp.status().ToString().c_str());
        *exit_code = 2;
        return;
      }
      spec.rdzv = *hp;
    }
    auto result = comm::LaunchLocalRanks(spec);
    if (!result.ok()) {
      std::fprintf(stderr, "tessera launch: %s\n", result.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = *result;
  });
}

}  // namespace tessera::cli
