// `tessera bench serve [--base-url URL] [--endpoint /v1/completions] [--model NAME]
// [--num-prompts N] [--request-rate R | --request-rates 1,2,4,inf] [--max-concurrency C]
// [--dataset random|…] [--json FILE] [--plot FILE.png] …`: load-tests any
// OpenAI-compatible server (tessera serve, llama-server, vLLM) with streamed requests
// and reports throughput and TTFT, TPOT, ITL and end-to-end latency, as vLLM's
// benchmark_serving does; a sweep runs the same prompts once per rate.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "apps/tessera/commands.h"
#include "base/status.h"
#include "bench/dataset.h"
#include "bench/plot.h"
#include "bench/progress.h"
#include "bench/report.h"
#include "bench/serve_benchmark.h"
#include "bench/sweep.h"

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
  std::string request_rates;  // --request-rates: a sweep when set
  std::string plot_path;
  bool request_rate_given = false;   // --request-rate was on the command line
  bool request_rates_given = false;  // --request-rates was (even if empty: refused)
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
  const bool sweep = args.request_rates_given;
  if (sweep && args.request_rate_given) {
    return InvalidArgumentError("give --request-rate or --request-rates, not both");
  }
  std::vector<double> rates = {args.request_rate};
  if (sweep) {
    TESSERA_ASSIGN_OR_RETURN(rates, bench::ParseRequestRates(args.request_rates));
  }
  // Fail before the benchmark, not after it, when the plot cannot be drawn.
  if (!args.plot_path.empty() && !bench::GnuplotOnPath()) {
    return UnavailableError(
        "--plot needs gnuplot, which is not on PATH; install it (Debian: apt-get install "
        "gnuplot-nox) or drop --plot");
  }
  if (args.endpoint.model.empty()) {
    TESSERA_ASSIGN_OR_RETURN(args.endpoint.model, bench::FetchFirstModelId(args.endpoint));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<bench::BenchRequest> requests,
                           bench::MakeDataset(args.dataset));

  bench::LoadOptions load;
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
  info.max_concurrency = args.max_concurrency;
  info.ignore_eos = args.endpoint.ignore_eos;

  const std::string sweep_note = sweep ? ", request rates " + args.request_rates : "";
  std::printf(
      "tessera bench serve: %lld prompts (%s, ~%lld input words, %lld output tokens) to "
      "%s%s, model %s%s\n",
      static_cast<long long>(requests.size()), info.dataset.c_str(),
      static_cast<long long>(args.dataset.input_len),
      static_cast<long long>(args.dataset.output_len), info.base_url.c_str(), info.endpoint.c_str(),
      info.model.c_str(), sweep_note.c_str());
  const bool stderr_is_terminal = ::isatty(STDERR_FILENO) == 1;
  std::vector<bench::SweepPoint> points;
  nlohmann::json records = nlohmann::json::array();
  int64_t total_completed = 0, total_failed = 0;
  for (double rate : rates) {
    load.arrivals.request_rate = rate;
    info.arrivals = load.arrivals;
    const std::string label = sweep ? "rate " + bench::RateLabel(rate) : "";
    if (sweep) std::printf("\n--- request rate %s ---\n", bench::RateLabel(rate).c_str());
    std::fflush(stdout);
    bench::BenchmarkRun run;
    {
      bench::ProgressReporter progress(stderr, stderr_is_terminal,
                                       static_cast<int64_t>(requests.size()), label);
      load.on_request_done = [&progress](const bench::RequestOutcome& o) {
        progress.OnRequestDone(o);
      };
      run = bench::RunServeBenchmark(args.endpoint, load, requests);
      load.on_request_done = nullptr;
      progress.Finish();  // ends the bar's line before the table
    }
    bench::ServeMetrics metrics = bench::ComputeServeMetrics(requests, run);
    std::fputs(bench::FormatServeReport(info, metrics).c_str(), stdout);
    std::fflush(stdout);
    total_completed += metrics.completed;
    total_failed += metrics.failed;
    if (!args.json_path.empty()) records.push_back(bench::ServeReportJson(info, metrics, run));
    points.push_back({.request_rate = rate, .metrics = std::move(metrics)});
  }
  if (sweep) {
    std::fputs(("\n" + bench::FormatSweepSummary(points)).c_str(), stdout);
    std::fflush(stdout);
  }

  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    if (!out) return NotFoundError("cannot create --json file " + args.json_path);
    // A sweep writes one record per rate; a single run its record alone.
    out << (sweep ? records : records.at(0)).dump(2) << "\n";
    if (!out.flush()) return InternalError("writing " + args.json_path + " failed");
  }
  if (total_completed == 0) {
    return UnavailableError("all " + std::to_string(total_failed) + " requests failed");
  }
  if (!args.plot_path.empty()) {
    const bench::PlotFiles files = bench::PlotFilesFor(args.plot_path);
    const std::string title = "tessera bench serve: " + info.model + ", " + info.dataset + ", " +
                              std::to_string(args.dataset.input_len) + " in / " +
                              std::to_string(args.dataset.output_len) + " out, " +
                              std::to_string(args.dataset.num_prompts) + " prompts per rate";
    TESSERA_RETURN_IF_ERROR(bench::WritePlot(points, files, title));
    std::printf("plot: %s (data %s, gnuplot script %s)\n", files.png_path.c_str(),
                files.data_path.c_str(), files.script_path.c_str());
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
  CLI::Option* request_rate =
      cmd->add_option("--request-rate", args->request_rate,
                      "Mean requests per second; inf sends them all at once")
          ->capture_default_str();
  CLI::Option* request_rates =
      cmd->add_option("--request-rates", args->request_rates,
                      "A sweep, e.g. 1,2,4,inf: one benchmark per rate with the same prompts, then "
                      "a summary table");
  cmd->add_option("--arrival", args->arrival,
                  "Arrival process at --request-rate: poisson (gamma with --burstiness) or fixed")
      ->capture_default_str();
  cmd->add_option("--burstiness", args->burstiness,
                  "Gamma shape of poisson arrivals: 1 = Poisson, < 1 burstier, > 1 more even")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", args->max_concurrency,
                  "Most requests in flight at once (0 = unbounded)")
      ->capture_default_str();
  cmd->add_option("--dataset", args->dataset_name,
                  "random (no sharing), shared-prefix (--num-prefixes tenants' system prompts), "
                  "mixed, or multi-turn (--num-turns; each turn resends the conversation)")
      ->capture_default_str();
  cmd->add_option("--num-prefixes", args->dataset.num_prefixes,
                  "shared-prefix: tenants, each with its own --prefix-len prefix (request i: "
                  "tenant i mod N)")
      ->capture_default_str();
  cmd->add_flag("--shuffle-tenants", args->dataset.shuffle_tenants,
                "shared-prefix: the tenants' requests in a random order (as many each)");
  cmd->add_option("--num-turns", args->dataset.num_turns,
                  "multi-turn: turns per conversation (--num-prompts / turns conversations)")
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
  cmd->add_option("--json", args->json_path,
                  "Write the results as JSON to FILE (a sweep: an array, one record per rate)");
  cmd->add_option("--plot", args->plot_path,
                  "Draw TTFT and TPOT p50/p99 vs output tok/s, one point per rate, to FILE.png "
                  "with gnuplot (also writes FILE.dat and FILE.gp)");
  cmd->callback([args, exit_code, request_rate, request_rates] {
    args->request_rate_given = request_rate->count() > 0;
    args->request_rates_given = request_rates->count() > 0;
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
