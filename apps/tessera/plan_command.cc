// `tessera plan`: memory fit, communication volume and predicted latency of every
// TP/PP/EP/DP/CP (and prefill/decode split) layout of a model on a cluster, ranked
// for a goal; `--calibrate` measures this machine into a cluster file. plan/ does
// the arithmetic; this file reads flags and GGUF files, runs gnuplot and the
// calibration. Exit 0 on success, 2 on bad input (unknown preset, impossible
// cluster, a layout that cannot divide the model), 3 when nothing fits, 1 otherwise.
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "apps/tessera/commands.h"
#include "apps/tessera/plan_inputs.h"
#include "base/env.h"
#include "base/memory_bandwidth.h"
#include "base/thread_pool.h"
#include "kernels/rate_probe.h"
#include "kernels/weight_type.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/estimate.h"
#include "plan/layout.h"
#include "plan/presets.h"
#include "plan/recommend.h"
#include "plan/report.h"

namespace tessera::cli {
namespace {

struct PlanArgs {
  std::string model = "llama-3-8b";
  std::string cluster = "8xh100";
  int64_t nodes = 0;
  int64_t devices_per_node = 0;
  std::string device;
  double device_memory_gb = 0;
  double memory_bandwidth_gbps = 0;
  double tflops = 0;
  std::string intra;
  std::string inter;
  int64_t prompt = 512;
  int64_t output = 128;
  int64_t concurrency = 1;
  double rate = 0;
  std::string weight_dtype;  // default: the model's
  std::string kv_dtype = "f16";
  std::string act_dtype = "f32";
  double mem_util = 0.9;
  std::string allreduce = "auto";
  std::string goal = "latency";
  std::string layout;
  std::string prefill_layout;
  bool pd = false;
  bool no_cp = false;
  int top = 10;
  bool json = false;
  std::string plot;
  bool list = false;
  bool calibrate = false;
  std::string out = "cluster-this-machine.json";
  bool skip_bench = false;
  double probe_seconds = kernels::RateProbeOptions{}.seconds;
  // Flags whose presence matters (CLI11 counts them).
  CLI::Option* nodes_opt = nullptr;
  CLI::Option* dpn_opt = nullptr;
  CLI::Option* mem_opt = nullptr;
};

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return 2;
    case StatusCode::kResourceExhausted:
      return 3;
    default:
      return 1;
  }
}

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<plan::ModelShape> LoadModel(const std::string& spec) {
  if (EndsWith(spec, ".gguf") || model::IsCheckpointDirectory(spec)) {
    return ModelShapeFromGguf(spec);  // a GGUF or a Hugging Face checkpoint directory
  }
  if (EndsWith(spec, ".json")) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, ReadFile(spec));
    return plan::ParseModelShapeJson(text, spec);
  }
  return plan::ModelPreset(spec);
}

Result<plan::Cluster> LoadCluster(const PlanArgs& a) {
  plan::Cluster c;
  if (EndsWith(a.cluster, ".json") || access(a.cluster.c_str(), F_OK) == 0) {
    TESSERA_ASSIGN_OR_RETURN(c, plan::LoadClusterFile(a.cluster));
  } else {
    TESSERA_ASSIGN_OR_RETURN(c, plan::ClusterPreset(a.cluster));
  }
  if (!a.device.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.device, plan::DevicePreset(a.device));
  }
  if (a.nodes_opt->count() > 0) c.nodes = a.nodes;
  if (a.dpn_opt->count() > 0) c.devices_per_node = a.devices_per_node;
  if (a.mem_opt->count() > 0) c.device.memory_gb = a.device_memory_gb;
  if (a.memory_bandwidth_gbps != 0) c.device.memory_bandwidth_gbps = a.memory_bandwidth_gbps;
  if (a.tflops != 0) c.device.tflops = a.tflops;
  if (!a.intra.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.intra_link, plan::ParseLinkSpec(a.intra));
  }
  if (!a.inter.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.inter_link, plan::ParseLinkSpec(a.inter));
  }
  TESSERA_RETURN_IF_ERROR(plan::ValidateCluster(c));
  return c;
}

Result<plan::Workload> LoadWorkload(const PlanArgs& a, const plan::ModelShape& model) {
  plan::Workload w;
  if (a.prompt < 1 || a.output < 1) {
    return InvalidArgumentError("--prompt and --output must be at least 1 token");
  }
  if (a.concurrency < 1) return InvalidArgumentError("--concurrency must be at least 1");
  if (a.rate < 0) return InvalidArgumentError("--rate must not be negative");
  if (!(a.mem_util > 0 && a.mem_util <= 1)) {
    return InvalidArgumentError("--mem-util must be in (0, 1]");
  }
  w.prompt_tokens = a.prompt;
  w.output_tokens = a.output;
  w.concurrency = a.concurrency;
  w.request_rate = a.rate;
  w.memory_utilization = a.mem_util;
  TESSERA_ASSIGN_OR_RETURN(
      w.weight_dtype,
      plan::ParseDType(a.weight_dtype.empty() ? model.weight_dtype : a.weight_dtype));
  TESSERA_ASSIGN_OR_RETURN(w.kv_dtype, plan::ParseDType(a.kv_dtype));
  TESSERA_ASSIGN_OR_RETURN(w.act_dtype, plan::ParseDType(a.act_dtype));
  if (w.act_dtype.quantized()) {
    return InvalidArgumentError("--act-dtype must be a plain format (f32, f16, bf16, fp8)");
  }
  // The comm library's knobs, so the prediction follows what a run would choose;
  // --allreduce takes precedence.
  const std::string algo_name =
      a.allreduce != "auto" ? a.allreduce : EnvStringOr("TESSERA_ALLREDUCE_ALGO", "auto");
  if (algo_name != "auto") {
    TESSERA_ASSIGN_OR_RETURN(plan::AllReduceAlgo algo, plan::ParseAllReduceAlgo(algo_name));
    w.allreduce_algo = algo;
  }
  TESSERA_ASSIGN_OR_RETURN(w.allreduce_small_bytes,
                           EnvIntOr("TESSERA_ALLREDUCE_SMALL_BYTES", w.allreduce_small_bytes));
  TESSERA_ASSIGN_OR_RETURN(w.allreduce_oneshot_bytes,
                           EnvIntOr("TESSERA_ALLREDUCE_ONESHOT_BYTES", w.allreduce_oneshot_bytes));
  // One-shot rides on shared memory: a forced TCP transport never uses it.
  if (EnvStringOr("TESSERA_TRANSPORT", "auto") == "tcp") w.allreduce_oneshot_bytes = 0;
  const std::string allgather = EnvStringOr("TESSERA_ALLGATHER_ALGO", "auto");
  if (allgather == "ring") {
    w.allgather_algo = plan::AllGatherAlgo::kRing;
  } else if (allgather == "bruck") {
    w.allgather_algo = plan::AllGatherAlgo::kBruck;
  } else if (allgather != "auto") {
    return InvalidArgumentError("TESSERA_ALLGATHER_ALGO='" + allgather +
                                "': expected auto, ring or bruck");
  }
  return w;
}

void PrintList() {
  auto print = [](const char* what, const std::vector<std::string>& names) {
    std::printf("%s:", what);
    for (const std::string& n : names) std::printf(" %s", n.c_str());
    std::printf("\n");
  };
  print("models", plan::ModelPresetNames());
  print("clusters", plan::ClusterPresetNames());
  print("devices", plan::DevicePresetNames());
  print("links", plan::LinkPresetNames());
  print("dtypes", plan::KnownDTypeNames());
}

Status WritePlot(const std::string& script) {
  FILE* pipe = popen("gnuplot 2>&1", "w");
  if (pipe == nullptr) return UnavailableError("cannot start gnuplot (Debian: gnuplot-nox)");
  std::fwrite(script.data(), 1, script.size(), pipe);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return UnavailableError("gnuplot failed (exit status " + std::to_string(rc) +
                            "); is it installed? (Debian: gnuplot-nox)");
  }
  return Status::Ok();
}

// Runs `tessera bench comm` on 2 local ranks for one transport; the JSON text or an
// error saying why not.
Result<std::string> RunBenchComm(const std::string& transport) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return UnavailableError("cannot find the tessera binary (/proc/self/exe)");
  self[n] = '\0';
  char tmpl[] = "/tmp/tessera-plan-bench-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return InternalError("mkstemp failed");
  close(fd);
  const std::string json_path = tmpl;
  const std::string command =
      std::string("'") + self + "' bench comm --np 2 --op sendrecv" + " --transport " + transport +
      " --min-bytes 8 --max-bytes 16M --json '" + json_path + "' > /dev/null 2>&1";
  const int rc = std::system(command.c_str());
  Result<std::string> text = ReadFile(json_path);
  unlink(json_path.c_str());
  if (rc != 0) {
    return UnavailableError("`tessera bench comm --transport " + transport +
                            " --json` failed or is not available in this build (exit status " +
                            std::to_string(rc) + ")");
  }
  return text;
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int Calibrate(const PlanArgs& a) {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::fprintf(stderr, "calibrating: FLOP/s per thread (FMA loop)...\n");
  const double fma_flops = plan::MeasureFlopsPerThread(0.3, 3);
  std::map<std::string, double> gemv_gbps, gemv_all_gbps, gemm_tflops;
  std::map<std::string, std::map<int64_t, double>> rows_gemv_gbps, node_rows_gemv_gbps;
  std::map<std::string, std::map<int64_t, double>> gemv_cols_gbps, node_gemv_cols_gbps;
  std::map<std::string, double> gemv_call_us, node_gemv_call_us;
  ThreadPool pool(threads);
  for (kernels::WeightType type :
       {kernels::WeightType::kF32, kernels::WeightType::kF16, kernels::WeightType::kBF16,
        kernels::WeightType::kQ8_0, kernels::WeightType::kQ4_0, kernels::WeightType::kQ4_K,
        kernels::WeightType::kQ6_K}) {
    const std::string name = Lower(kernels::TraitsOf(type).name);
    std::fprintf(stderr, "calibrating: kernels' GEMV and GEMM, %s...\n", name.c_str());
    kernels::RateProbeOptions options;
    options.seconds = a.probe_seconds;
    const kernels::KernelRates rates = kernels::MeasureKernelRates(type, pool, options);
    gemv_gbps[name] = rates.gemv_bytes_per_s / 1e9;
    gemv_all_gbps[name] = rates.gemv_all_bytes_per_s / 1e9;
    gemm_tflops[name] = rates.gemm_flops / 1e12;
    for (const auto& [rows, rate] : rates.rows_bytes_per_s) rows_gemv_gbps[name][rows] = rate / 1e9;
    for (const auto& [rows, rate] : rates.rows_all_bytes_per_s) {
      node_rows_gemv_gbps[name][rows] = rate / 1e9;
    }
    for (const auto& [cols, rate] : rates.cols_bytes_per_s) gemv_cols_gbps[name][cols] = rate / 1e9;
    gemv_call_us[name] = rates.call_seconds * 1e6;
    node_gemv_call_us[name] = rates.call_all_seconds * 1e6;
    for (const auto& [cols, rate] : rates.cols_all_bytes_per_s) {
      node_gemv_cols_gbps[name][cols] = rate / 1e9;
    }
  }
  const double flops = gemm_tflops.at("f32") * 1e12;
  std::fprintf(stderr, "calibrating: memory bandwidth (1 and %d threads)...\n", threads);
  MemoryBandwidthOptions one;
  one.buffer_bytes = size_t{128} << 20;
  const MemoryBandwidth bw1 = MeasureMemoryBandwidth(one);
  MemoryBandwidthOptions all = one;
  all.num_threads = threads;
  const MemoryBandwidth bwn = MeasureMemoryBandwidth(all);
  const double per_device_bw = std::min(bw1.read_bytes_per_s, bwn.read_bytes_per_s / threads);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const double mem_bytes = static_cast<double>(pages) * static_cast<double>(page_size);

  plan::Cluster c;
  c.name = "this-machine";
  c.nodes = 1;
  c.devices_per_node = threads;  // one rank per core, one thread each
  c.device = {"this-machine-core", mem_bytes / threads / 1e9,
              per_device_bw / 1e9, flops / 1e12,
              gemv_gbps,           gemm_tflops};
  c.device.rows_gemv_gbps = rows_gemv_gbps;
  c.device.gemv_cols_gbps = gemv_cols_gbps;
  c.device.gemv_call_us = gemv_call_us;
  c.intra_link = *plan::LinkPreset("shm");
  c.inter_link = *plan::LinkPreset("1gbe");
  c.cpu.cores = threads;
  c.cpu.thread_read_gbps = bw1.read_bytes_per_s / 1e9;
  c.cpu.node_read_gbps = bwn.read_bytes_per_s / 1e9;
  c.cpu.node_gemv_gbps = gemv_all_gbps;
  c.cpu.node_rows_gemv_gbps = node_rows_gemv_gbps;
  c.cpu.node_gemv_cols_gbps = node_gemv_cols_gbps;
  c.cpu.node_gemv_call_us = node_gemv_call_us;
  std::string measured =
      "{\"matmul_f32_flops_per_thread\": " + std::to_string(flops) +
      ", \"fma_loop_flops_per_thread\": " + std::to_string(fma_flops) +
      ", \"read_bytes_per_s_1_thread\": " + std::to_string(bw1.read_bytes_per_s) +
      ", \"read_bytes_per_s_all\": " + std::to_string(bwn.read_bytes_per_s) +
      ", \"threads\": " + std::to_string(threads);
  for (const std::string transport : {"shm", "tcp"}) {
    if (a.skip_bench) break;
    std::fprintf(stderr, "calibrating: tessera bench comm --transport %s...\n", transport.c_str());
    Result<std::string> bench = RunBenchComm(transport);
    Result<std::map<std::string, plan::Link>> links =
        bench.ok() ? plan::FitLinksFromBenchJson(*bench)
                   : Result<std::map<std::string, plan::Link>>(bench.status());
    if (!links.ok()) {
      std::fprintf(stderr, "  %s link not measured: %s (keeping the '%s' preset)\n",
                   transport.c_str(), links.status().message().c_str(),
                   transport == "shm" ? "shm" : "1gbe");
      measured += ", \"" + transport + "\": \"not measured: " + links.status().message() + "\"";
      continue;
    }
    for (const auto& [name, link] : *links) {
      if (name != transport) continue;
      (transport == "shm" ? c.intra_link : c.inter_link) = link;
      measured += ", \"" + transport +
                  "\": {\"bandwidth_gbps\": " + std::to_string(link.bandwidth_gbps) +
                  ", \"latency_us\": " + std::to_string(link.latency_us) + "}";
    }
  }
  measured += "}";
  const std::string text = plan::ClusterToJson(c, measured);
  std::ofstream out(a.out);
  if (!out || !(out << text)) {
    std::fprintf(stderr, "tessera plan: cannot write %s\n", a.out.c_str());
    return 1;
  }
  std::printf("%s", text.c_str());
  std::fprintf(stderr, "wrote %s (use it with: tessera plan --cluster %s ...)\n", a.out.c_str(),
               a.out.c_str());
  return 0;
}

int RunPlan(const PlanArgs& a) {
  if (a.list) {
    PrintList();
    return 0;
  }
  if (a.calibrate) return Calibrate(a);
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "tessera plan: %s\n", status.ToString().c_str());
    return ExitCodeFor(status);
  };
  Result<plan::ModelShape> model = LoadModel(a.model);
  if (!model.ok()) return fail(model.status());
  Result<plan::Cluster> cluster = LoadCluster(a);
  if (!cluster.ok()) return fail(cluster.status());
  Result<plan::Workload> workload = LoadWorkload(a, *model);
  if (!workload.ok()) return fail(workload.status());
  Result<plan::Goal> goal = plan::ParseGoal(a.goal);
  if (!goal.ok()) return fail(goal.status());
  const plan::ReportContext ctx{*model, *cluster, *workload, *goal};

  plan::Plan result;
  if (!a.layout.empty() || !a.prefill_layout.empty()) {
    // One layout, as given.
    plan::Layout layout;
    if (!a.layout.empty()) {
      Result<plan::Parallelism> p = plan::ParseParallelism(a.layout);
      if (!p.ok()) return fail(p.status());
      layout.decode = *p;
    }
    if (!a.prefill_layout.empty()) {
      Result<plan::Parallelism> p = plan::ParseParallelism(a.prefill_layout);
      if (!p.ok()) return fail(p.status());
      layout.prefill = *p;
    }
    Result<plan::Estimate> e = plan::EstimateLayout(*model, *cluster, *workload, layout);
    if (!e.ok()) return fail(e.status());
    result.considered = 1;
    result.ranked.push_back(*e);
    result.explanation = plan::Explain(*model, *cluster, *workload, *goal, result.ranked);
  } else {
    plan::EnumerateOptions options;
    options.prefill_decode_split = a.pd;
    options.context_parallel = !a.no_cp;
    Result<plan::Plan> made = plan::MakePlan(*model, *cluster, *workload, *goal, options);
    if (!made.ok()) return fail(made.status());
    result = std::move(made).value();
  }
  if (a.json) {
    std::printf("%s", plan::PlanToJson(ctx, result, a.top).c_str());
  } else {
    std::printf("%s\n", plan::FormatTable(ctx, result, a.top).c_str());
    std::printf("%s\n\n", result.explanation.c_str());
    std::printf("%s", plan::FormatDetail(ctx, result.ranked.front()).c_str());
  }
  if (!a.plot.empty()) {
    // The top layouts, each swept over concurrency.
    std::vector<plan::PlotSeries> series;
    const int curves = std::min<int>(8, static_cast<int>(result.ranked.size()));
    for (int i = 0; i < curves; ++i) {
      const plan::Layout& layout = result.ranked[i].layout;
      series.push_back({"#" + std::to_string(i + 1) + " " + layout.ToString(),
                        plan::SweepConcurrency(*model, *cluster, *workload, layout, 1024)});
    }
    const Status plotted = WritePlot(plan::PlotScript(ctx, series, a.plot));
    if (!plotted.ok()) return fail(plotted);
    std::fprintf(stderr, "wrote %s\n", a.plot.c_str());
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Memory, communication volume and predicted latency of every TP/PP/EP/DP/CP/PD layout of "
      "a model on a cluster, ranked for a goal (see docs/plan.md)");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("-m,--model", a->model,
                  "model preset (see --list), a GGUF file (hyper-parameters only) or a JSON "
                  "shape file")
      ->capture_default_str();
  cmd->add_option("-c,--cluster", a->cluster,
                  "cluster preset (see --list) or cluster JSON file (e.g. from --calibrate)")
      ->capture_default_str();
  a->nodes_opt = cmd->add_option("--nodes", a->nodes, "override: number of nodes");
  a->dpn_opt =
      cmd->add_option("--devices-per-node", a->devices_per_node, "override: devices per node");
  cmd->add_option("--device", a->device, "override: device preset (see --list)");
  a->mem_opt =
      cmd->add_option("--device-memory", a->device_memory_gb, "override: device memory in GB");
  cmd->add_option("--memory-bandwidth", a->memory_bandwidth_gbps,
                  "override: device memory bandwidth in GB/s");
  cmd->add_option("--tflops", a->tflops, "override: device TFLOP/s");
  cmd->add_option("--intra", a->intra,
                  "override: intra-node link, a preset (nvlink, pcie, shm, ...) or GBPS:LAT_US");
  cmd->add_option("--inter", a->inter,
                  "override: inter-node link, a preset (infiniband, 1gbe, 10gbe, 100gbe, ...) or "
                  "GBPS:LAT_US");
  cmd->add_option("--prompt", a->prompt, "prompt tokens")->capture_default_str();
  cmd->add_option("--output", a->output, "output tokens")->capture_default_str();
  cmd->add_option("--concurrency", a->concurrency, "sequences in flight (whole deployment)")
      ->capture_default_str();
  cmd->add_option("--rate", a->rate,
                  "requests/s instead of --concurrency (in flight by Little's law)");
  cmd->add_option("--weight-dtype", a->weight_dtype,
                  "weight format (default: the model's): f32 f16 bf16 fp8 q8_0 q4_0 q4_k q6_k");
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache format")->capture_default_str();
  cmd->add_option("--act-dtype", a->act_dtype, "activation format on the wire")
      ->capture_default_str();
  cmd->add_option("--mem-util", a->mem_util, "share of device memory to use")
      ->capture_default_str();
  cmd->add_option("--allreduce", a->allreduce,
                  "all-reduce algorithm: auto (comm's choice, or TESSERA_ALLREDUCE_ALGO), ring, "
                  "rd, two-shot")
      ->capture_default_str();
  cmd->add_option("-g,--goal", a->goal, "latency, throughput or devices")->capture_default_str();
  cmd->add_option("--layout", a->layout, "evaluate only this layout, e.g. tp=2,pp=2");
  cmd->add_option("--prefill-layout", a->prefill_layout,
                  "with --layout: separate prefill instances (PD split), e.g. tp=4");
  cmd->add_flag("--pd", a->pd, "also consider prefill/decode splits");
  cmd->add_flag("--no-cp", a->no_cp, "do not consider context parallelism");
  cmd->add_option("--top", a->top, "layouts to list")->capture_default_str();
  cmd->add_flag("--json", a->json, "print the plan as JSON");
  cmd->add_option("--plot", a->plot, "write a latency/throughput PNG (gnuplot)");
  cmd->add_flag("--list", a->list, "list the presets and exit");
  cmd->add_flag("--calibrate", a->calibrate,
                "measure this machine (FLOP/s, memory bandwidth, shm/TCP via tessera bench comm) "
                "and write a cluster file");
  cmd->add_option("--out", a->out, "with --calibrate: the cluster file to write")
      ->capture_default_str();
  cmd->add_option("--probe-seconds", a->probe_seconds,
                  "with --calibrate: seconds each kernel rate is timed for (less: quicker, "
                  "noisier)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--skip-bench", a->skip_bench,
                "with --calibrate: do not run tessera bench comm (keep link presets)");
  cmd->callback([a, exit_code] { *exit_code = RunPlan(*a); });
}

}  // namespace tessera::cli
