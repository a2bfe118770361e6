// `tessera bench serve [--base-url URL] [--endpoint /v1/completions] [--model NAME]
// [--num-prompts N] [--request-rate R] [--max-concurrency C] [--dataset random|…]
// [--json FILE] …`: load-tests any OpenAI-compatible server (tessera serve,
// llama-server, vLLM) with streamed requests and reports throughput and TTFT,
// TPOT, ITL and end-to-end latency, as vLLM's benchmark_serving does.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "apps/tessera/commands.h"
#include "base/status.h"
#include "bench/dataset.h"
#include "bench/report.h"
#include "bench/serve_benchmark.h"

namespace tessera::cli {
namespace {

struct BenchServeArgs {
  bench::EndpointOptions endpoint;
  bench::DatasetOptions dataset;
  std::string dataset_name = "random";
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  std::string arrival = "poisson";
  int64_t max_concurrency = 0;
  std::string json_path;
};

Status RunBenchServe(BenchServeArgs args) {
  TESSERA_ASSIGN_OR_RETURN(args.dataset.kind, bench::ParseDatasetKind(args.dataset_name));
  if (!(args.request_rate > 0)) return InvalidArgumentError("--request-rate must be > 0 (or inf)");
  if (!(args.burstiness > 0)) return InvalidArgumentError("--burstiness must be > 0");
  if (args.arrival != "poisson" && args.arrival != "fixed") {
    return InvalidArgumentError("--arrival must be poisson or fixed, not '" + args.arrival + "'");
  }
  if (args.max_concurrency < 0) return InvalidArgumentError("--max-concurrency must be >= 0");
  if (!(args.endpoint.timeout_s > 0)) return InvalidArgumentError("--timeout must be > 0");
  if (args.endpoint.endpoint.empty() || args.endpoint.endpoint.front() != '/') {
    return InvalidArgumentError("--endpoint must be a path such as /v1/completions");
  }
  TESSERA_RETURN_IF_ERROR(bench::ParseBaseUrl(args.endpoint.base_url).status());
  if (args.endpoint.model.empty()) {
    TESSERA_ASSIGN_OR_RETURN(args.endpoint.model, bench::FetchFirstModelId(args.endpoint));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<bench::BenchRequest> requests,
                           bench::MakeDataset(args.dataset));

  bench::LoadOptions load;
  load.arrivals.request_rate = args.request_rate;
  load.arrivals.burstiness = args.burstiness;
  load.arrivals.process =
      args.arrival == "fixed" ? bench::ArrivalProcess::kFixed : bench::ArrivalProcess::kPoisson;
  load.arrivals.seed = args.dataset.seed;
  load.max_concurrency = args.max_concurrency;

  bench::ServeRunInfo info;
  info.base_url = args.endpoint.base_url;
  info.endpoint = args.endpoint.endpoint;
  info.model = args.endpoint.model;
  info.dataset = std::string(bench::DatasetKindName(args.dataset.kind));
  info.num_prompts = args.dataset.num_prompts;
  info.input_len = args.dataset.input_len;
  info.output_len = args.dataset.output_len;
  info.prefix_len = args.dataset.prefix_len;
  info.arrivals = load.arrivals;
  info.max_concurrency = args.max_concurrency;
  info.ignore_eos = args.endpoint.ignore_eos;

  std::printf(
      "tessera bench serve: %lld prompts (%s, ~%lld input words, %lld output tokens) to "
      "%s%s, model %s\n",
      static_cast<long long>(requests.size()), info.dataset.c_str(),
      static_cast<long long>(args.dataset.input_len),
      static_cast<long long>(args.dataset.output_len), info.base_url.c_str(), info.endpoint.c_str(),
      info.model.c_str());
  std::fflush(stdout);
  bench::BenchmarkRun run = bench::RunServeBenchmark(args.endpoint, load, requests);
  bench::ServeMetrics metrics = bench::ComputeServeMetrics(requests, run);
  std::fputs(bench::FormatServeReport(info, metrics).c_str(), stdout);

  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    if (!out) return NotFoundError("cannot create --json file " + args.json_path);
    out << bench::ServeReportJson(info, metrics, run).dump(2) << "\n";
    if (!out.flush()) return InternalError("writing " + args.json_path + " failed");
  }
  if (metrics.completed == 0) {
    return UnavailableError("all " + std::to_string(metrics.failed) + " requests failed");
  }
  return Status::Ok();
}

}  // namespace

void AddBenchServeCommand(CLI::App& bench, int* exit_code) {
  auto args = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "serve",
      "Load-test an OpenAI-compatible server (tessera, llama-server, vLLM): throughput, TTFT, "
      "TPOT, ITL, end-to-end latency");
  cmd->add_option("--base-url", args->endpoint.base_url, "Server URL (http[s]://host:port)")
      ->capture_default_str();
  cmd->add_option("--endpoint", args->endpoint.endpoint,
                  "API path: /v1/completions or /v1/chat/completions")
      ->capture_default_str();
  cmd->add_option("--model", args->endpoint.model,
                  "Model name sent in requests (default: first id of GET /v1/models)");
  cmd->add_option("--api-key", args->endpoint.api_key, "Sent as 'Authorization: Bearer KEY'");
  cmd->add_option("-n,--num-prompts", args->dataset.num_prompts, "Requests to send")
      ->capture_default_str();
  cmd->add_option("--request-rate", args->request_rate,
                  "Mean requests per second; inf sends them all at once")
      ->capture_default_str();
  cmd->add_option("--arrival", args->arrival,
                  "Arrival process at --request-rate: poisson (gamma with --burstiness) or fixed")
      ->capture_default_str();
  cmd->add_option("--burstiness", args->burstiness,
                  "Gamma shape of poisson arrivals: 1 = Poisson, < 1 burstier, > 1 more even")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", args->max_concurrency,
                  "Most requests in flight at once (0 = unbounded)")
      ->capture_default_str();
  cmd->add_option("--dataset", args->dataset_name, "random, shared-prefix or mixed")
      ->capture_default_str();
  cmd->add_option("--input-len", args->dataset.input_len,
                  "Prompt words (≈ tokens) per request, after any shared prefix")
      ->capture_default_str();
  cmd->add_option("--output-len", args->dataset.output_len, "max_tokens per request")
      ->capture_default_str();
  cmd->add_option("--prefix-len", args->dataset.prefix_len,
                  "shared-prefix: words in the prefix common to all prompts")
      ->capture_default_str();
  cmd->add_option("--long-input-len", args->dataset.long_input_len,
                  "mixed: words in a long prompt (0 = 8 x --input-len)")
      ->capture_default_str();
  cmd->add_option("--long-fraction", args->dataset.long_fraction,
                  "mixed: share of prompts that are long")
      ->capture_default_str();
  cmd->add_option("--seed", args->dataset.seed, "Seed of the prompts and arrival times")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", args->endpoint.ignore_eos,
                "Send \"ignore_eos\": true so every request generates --output-len tokens");
  cmd->add_option("--timeout", args->endpoint.timeout_s, "Seconds one request may take")
      ->capture_default_str();
  cmd->add_option("--json", args->json_path, "Write the results as JSON to FILE");
  cmd->callback([args, exit_code] {
    Status status = RunBenchServe(*args);
    if (!status.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "tessera bench serve: error: %s\n", status.ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
