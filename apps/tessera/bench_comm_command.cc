// `tessera bench comm`: the collective benchmark. Without a launcher environment
// it starts --np local ranks of itself (through the launcher) and each runs the
// benchmark; under `tessera launch`, torchrun, mpirun or srun it runs as one rank
// of that job, so the same command benchmarks across machines.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/tessera/cli_util.h"
#include "apps/tessera/commands.h"
#include "base/env.h"
#include "comm/bench/comm_bench.h"
#include "comm/launcher.h"
#include "comm/rank_env.h"

namespace tessera::cli {

void AddBenchCommCommand(CLI::App& bench, int* exit_code) {
  CLI::App* cmd = bench.add_subcommand(
      "comm", "Collective benchmark: nccl-tests-style table per op (size, time, algbw, busbw)");
  struct Flags {
    int np = 2;
    std::vector<std::string> ops = {"all"};
    std::string transport = "auto";
    std::string algo = "auto";
    std::string dtype = "f32";
    std::string redop = "sum";
    std::string min_bytes = "8";
    std::string max_bytes = "256M";
    int iters = 0;
    int warmup = 3;
    bool check = false;
    bool baseline = false;
    bool shared_buffers = false;
    bool calibrate = false;
    std::string json;
    int64_t spin_us = -1;
    int64_t timeout_ms = 0;
    int64_t tcp_delay_us = -1;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--np", f->np, "Local ranks to start (ignored under a launcher)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--op", f->ops,
                  "allreduce|allgather|reducescatter|alltoall|alltoallv|alltoallvskew|broadcast|"
                  "reduce|gather|scatter|"
                  "sendrecv|all (repeatable)");
  cmd->add_option("--transport", f->transport,
                  "auto|shm|tcp|mpi (sets TESSERA_TRANSPORT; mpi: start it with mpirun)");
  cmd->add_option("--algo", f->algo,
                  "auto, or ring|rd|deterministic (allreduce), ring|bruck (allgather), "
                  "tree|chain (broadcast)");
  cmd->add_option("--dtype", f->dtype, "f32|f16|bf16|i32|i64|u8");
  cmd->add_option("--redop", f->redop, "sum|prod|min|max|avg");
  cmd->add_option("--min-bytes,-b", f->min_bytes, "Smallest size (e.g. 8, 4k, 1M)");
  cmd->add_option("--max-bytes,-e", f->max_bytes, "Largest size (e.g. 256M)");
  cmd->add_option("--iters,-n", f->iters, "Timed iterations per size (0 = about 50 ms)");
  cmd->add_option("--warmup,-w", f->warmup, "Warm-up iterations per size");
  cmd->add_flag("--check,-c", f->check, "Verify every result against the exact reference");
  cmd->add_flag("--baseline", f->baseline,
                "Also measure memcpy, TCP loopback bandwidth and the cache-line round trip");
  cmd->add_flag("--register,-R", f->shared_buffers,
                "Buffers from Communicator::AllocateShared: same-host peers read them in place");
  cmd->add_flag("--calibrate", f->calibrate,
                "Measure this host's copy-mode calibration again (TESSERA_COMM_CALIBRATION=redo), "
                "rewrite its cache and print the table");
  cmd->add_option("--json", f->json, "Write one JSON record per (op, size) to FILE");
  cmd->add_option("--spin-us", f->spin_us, "Spin before sleeping, in us (-1 = automatic)");
  cmd->add_option("--timeout-ms", f->timeout_ms, "Per-operation deadline (0 = default)");
  cmd->add_option(
         "--tcp-delay-us", f->tcp_delay_us,
         "Emulated one-way latency per TCP message, in us (overrides TESSERA_TCP_DELAY_US; "
         "shared memory is never delayed)")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}));
  cmd->callback([f, exit_code] {
    auto env = comm::RankEnvFromEnvironment();
    if (!env.ok()) {
      std::fprintf(stderr, "tessera bench comm: %s\n", env.status().ToString().c_str());
      *exit_code = 2;
      return;
    }
    if (env->source == "none" && f->transport == "mpi") {
      std::fprintf(stderr,
                   "tessera bench comm: --transport mpi needs ranks started by MPI: mpirun -np "
                   "%d tessera bench comm --transport mpi …\n",
                   f->np);
      *exit_code = 2;
      return;
    }
    if (env->source == "none") {
      // Not launched: start --np ranks of this same command line.
      comm::LaunchSpec spec;
      spec.argv = OwnCommandLine();
      spec.nproc_per_node = f->np;
      auto result = comm::LaunchLocalRanks(spec);
      if (!result.ok()) {
        std::fprintf(stderr, "tessera bench comm: %s\n", result.status().ToString().c_str());
        *exit_code = 1;
        return;
      }
      *exit_code = *result;
      return;
    }
    auto options = comm::CommOptions::FromEnvironment();
    if (!options.ok()) {
      std::fprintf(stderr, "tessera bench comm: %s\n", options.status().ToString().c_str());
      *exit_code = 2;
      return;
    }
    auto transport = comm::ParseTransportKind(f->transport);
    auto dtype = comm::ParseDataType(f->dtype);
    auto redop = comm::ParseReduceOp(f->redop);
    auto min_bytes = ParseSizeBytes(f->min_bytes);
    auto max_bytes = ParseSizeBytes(f->max_bytes);
    if (!transport || !dtype || !redop || !min_bytes || !max_bytes || *min_bytes < 1 ||
        *max_bytes < *min_bytes) {
      std::fprintf(stderr, "tessera bench comm: bad --transport/--dtype/--redop/--*-bytes\n");
      *exit_code = 2;
      return;
    }
    if (f->transport != "auto") options->transport = *transport;
    if (f->spin_us >= 0) options->spin_us = f->spin_us;
    if (f->timeout_ms > 0) options->timeout_ms = f->timeout_ms;
    if (f->tcp_delay_us >= 0) options->tcp_emulated_delay_us = f->tcp_delay_us;
    if (f->calibrate) options->calibration = comm::CalibrationMode::kRedo;
    auto world = comm::InitWorld(*env, *options);
    if (!world.ok()) {
      std::fprintf(stderr, "tessera bench comm: %s\n", world.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    comm::CommBenchOptions bench;
    bench.ops = f->ops;
    bench.dtype = *dtype;
    bench.redop = *redop;
    bench.algo = f->algo;
    bench.min_bytes = static_cast<size_t>(*min_bytes);
    bench.max_bytes = static_cast<size_t>(*max_bytes);
    bench.iters = f->iters;
    bench.warmup = f->warmup;
    bench.check = f->check;
    bench.baseline = f->baseline;
    bench.shared_buffers = f->shared_buffers;
    bench.calibration_table = f->calibrate;
    bench.json_path = f->json;
    bench.label = "spin " + (f->spin_us >= 0 ? std::to_string(f->spin_us) + " us" : "auto") +
                  (f->shared_buffers ? ", shared buffers" : "");
    Status s = comm::RunCommBench(*world->comm, bench, stdout);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera bench comm: rank %d: %s\n", env->rank, s.ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
