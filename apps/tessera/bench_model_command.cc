// `tessera bench model MODEL.gguf [--threads 1,2] [--pp 512] [--tg 128]
// [--depth 0,2048] [--reps R] [--json FILE]`: llama-bench's tests on one rank — pp N
// (prefill N tokens in one step) and tg N (generate N tokens one step at a time),
// each after an untimed prefill of D tokens of context (--depth, llama-bench's -d)
// — plus, measured in the same run, the rate at which the kernels' own GEMV streams
// weights of the model's types (kernels/rate_probe.h) and the memory read bandwidth,
// and tg's time against the roofline they imply: weight bytes at the GEMV rate, KV
// cache bytes at the read bandwidth. The GEMV rate, not the read probe, is the
// roofline's denominator: the probe reads slower than the GEMV on some machines
// ("151% of the roofline" on an Intel Xeon VM) and faster on others.
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/tessera/commands.h"
#include "base/memory_bandwidth.h"
#include "base/proc_status.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/driver.h"
#include "engine/loaded_model.h"
#include "engine/stage_runner.h"
#include "kernels/rate_probe.h"
#include "kv/block_allocator.h"
#include "kv/block_table.h"

namespace tessera::cli {
namespace {

struct BenchModelArgs {
  std::string model_path;
  std::string threads = "1";
  int64_t pp = 512;
  int64_t tg = 128;
  std::string depths = "0";
  int reps = 3;
  std::string kv_type = "f16";
  std::string json_path;
};

struct BenchRecord {
  std::string test;   // "pp512", "tg128"
  int64_t depth = 0;  // tokens of context before the test
  int threads = 0;
  int64_t tokens = 0;
  double seconds = 0;       // mean over the repetitions
  double seconds_sd = 0;    // standard deviation
  double tokens_per_s = 0;  // tokens / mean seconds
  // tg only: bytes one decode step reads — weights, and K/V of the context it
  // attends (the mean over the test's steps) — and the bandwidth that implies.
  double weight_bytes_per_token = 0;
  double kv_bytes_per_token = 0;
  double implied_bytes_per_s = 0;
  // Measured with the same thread count: the mean of the probes around its tests
  // (before and after them when the peak RSS can be reset between, else one after).
  double memory_read_bytes_per_s = 0;
  std::vector<double> memory_read_probes;
  // The same for the kernels' GEMV over the model's weight types (KernelGemvRate):
  // the mean of the probes, and each.
  double gemv_bytes_per_s = 0;
  std::vector<double> gemv_probes;
  // tg only: the roofline's time per token (weights at gemv_bytes_per_s, the KV cache
  // at memory_read_bytes_per_s) × tokens/s: the share of the measured time it explains.
  double roofline_fraction = 0;
};

// Weight bytes per second of the kernels' GEMV over a decode step's mix of weight
// types, on `pool`: bytes / Σ_type (bytes of the type / the type's measured rate).
// Each type's rate is its own: zero matrices of 2048 × 2048 in the engine's layout,
// 128 MiB of them (kernels::WeightStreamProbe, as `plan --calibrate` measures).
double KernelGemvRate(const std::map<kernels::WeightType, int64_t>& bytes_by_type,
                      ThreadPool& pool) {
  double bytes = 0, seconds = 0;
  for (const auto& [type, type_bytes] : bytes_by_type) {
    const kernels::WeightStreamProbe probe(type);
    const double rate = static_cast<double>(probe.read_bytes()) / probe.SecondsPerPass(1, &pool);
    bytes += static_cast<double>(type_bytes);
    seconds += static_cast<double>(type_bytes) / rate;
  }
  return seconds > 0 ? bytes / seconds : 0;
}

// A comma-separated list of integers in [min, max] for option `name`.
Result<std::vector<int64_t>> ParseList(const std::string& text, const char* name, int64_t min,
                                       int64_t max) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
      return InvalidArgumentError(
          std::string(name) + " wants a comma-separated list of counts in [" + std::to_string(min) +
          ", " + std::to_string(max) + "], not '" + text + "'");
    }
    out.push_back(value);
  }
  if (out.empty()) return InvalidArgumentError(std::string(name) + " is empty");
  return out;
}

double Mean(const std::vector<double>& xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  return xs.empty() ? 0 : sum / static_cast<double>(xs.size());
}

double StdDev(const std::vector<double>& xs) {
  if (xs.size() < 2) return 0;
  const double mean = Mean(xs);
  double sum = 0;
  for (double x : xs) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(xs.size() - 1));
}

// One sequence driven straight through the rank's runner, as llama-bench drives
// llama_decode: the context is refilled with random tokens (untimed) before each
// repetition, then the test's steps are timed, random tokens as well (their values
// do not change the work).
class BenchSequence {
 public:
  BenchSequence(engine::StepExecutor& runner, int64_t vocab, std::mt19937_64& rng)
      : runner_(runner),
        vocab_(vocab),
        rng_(rng),
        allocator_(runner.num_kv_blocks()),
        table_(runner.kv_block_size()) {}
  ~BenchSequence() { table_.Release(allocator_); }

  // Empties the sequence, then prefills `depth` tokens in steps of kDepthChunk.
  Status Refill(int64_t depth) {
    table_.Release(allocator_);
    length_ = 0;
    while (length_ < depth) {
      TESSERA_RETURN_IF_ERROR(Step(std::min(kDepthChunk, depth - length_)).status());
    }
    return Status::Ok();
  }

  // Runs one step of `n` new tokens at the end of the sequence; its seconds.
  Result<double> Step(int64_t n) {
    tokens_.resize(static_cast<size_t>(n));
    for (int32_t& t : tokens_) t = static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_));
    TESSERA_RETURN_IF_ERROR(table_.Reserve(allocator_, length_ + n));
    const engine::StepEntry entry{
        .new_tokens = tokens_, .start_position = length_, .block_table = &table_};
    const auto start = std::chrono::steady_clock::now();
    TESSERA_RETURN_IF_ERROR(runner_.Step({&entry, 1}).status());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    length_ += n;
    return took.count();
  }

 private:
  static constexpr int64_t kDepthChunk = 512;
  engine::StepExecutor& runner_;
  const int64_t vocab_;
  std::mt19937_64& rng_;
  kv::BlockAllocator allocator_;
  kv::BlockTable table_;
  int64_t length_ = 0;
  std::vector<int32_t> tokens_;
};

// "pp512", or "pp512 @ d2048" after a context of 2048 (llama-bench's names).
std::string TestName(const char* kind, int64_t tokens, int64_t depth) {
  std::string name = kind + std::to_string(tokens);
  if (depth > 0) name += " @ d" + std::to_string(depth);
  return name;
}

// The process's peak resident memory since it started or since the last
// ResetPeakRss (VmHWM; getrusage's figure cannot be reset).
int64_t PeakRssBytes() {
  long kb = static_cast<long>(ProcStatusBytes("VmHWM") / 1024);
  if (kb == 0) {  // no /proc: the lifetime peak
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    kb = usage.ru_maxrss;
  }
  return static_cast<int64_t>(kb) * 1024;
}

// Sets the peak back to the current resident memory (Linux ≥ 4.0); false where
// it cannot.
bool ResetPeakRss() {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen("/proc/self/clear_refs", "w"),
                                                    &std::fclose);
  return f && std::fputs("5", f.get()) >= 0 && std::fflush(f.get()) == 0;
}

// One record per test; the model path and every string escaped (nlohmann::json).
std::string RecordsJson(const std::vector<BenchRecord>& records, const std::string& model,
                        int64_t model_bytes, const std::string& kv_type) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const BenchRecord& r : records) {
    nlohmann::ordered_json j = {{"test", r.test},
                                {"depth", r.depth},
                                {"threads", r.threads},
                                {"tokens", r.tokens},
                                {"seconds", r.seconds},
                                {"seconds_sd", r.seconds_sd},
                                {"tokens_per_s", r.tokens_per_s},
                                {"model", model},
                                {"model_bytes", model_bytes},
                                {"kv_type", kv_type},
                                {"memory_read_bytes_per_s", r.memory_read_bytes_per_s},
                                {"memory_read_probes_bytes_per_s", r.memory_read_probes},
                                {"gemv_bytes_per_s", r.gemv_bytes_per_s},
                                {"gemv_probes_bytes_per_s", r.gemv_probes}};
    if (r.weight_bytes_per_token > 0) {
      j["weight_bytes_per_token"] = r.weight_bytes_per_token;
      j["kv_bytes_per_token"] = r.kv_bytes_per_token;
      j["implied_bytes_per_s"] = r.implied_bytes_per_s;
      j["roofline_fraction"] = r.roofline_fraction;
      j["read_roofline_fraction"] = r.implied_bytes_per_s / r.memory_read_bytes_per_s;
    }
    out.push_back(std::move(j));
  }
  return out.dump(2) + "\n";
}

Status RunBenchModel(const BenchModelArgs& args) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> thread_counts,
                           ParseList(args.threads, "--threads", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> depths,
                           ParseList(args.depths, "--depth", 0, int64_t{1} << 24));
  if (args.pp < 0 || args.tg < 0) return InvalidArgumentError("--pp and --tg must be >= 0");
  if (args.pp == 0 && args.tg == 0) {
    return InvalidArgumentError("--pp and --tg are both 0: no test to run");
  }
  if (args.reps < 1) return InvalidArgumentError("--reps must be >= 1");
  if (args.kv_type != "f32" && args.kv_type != "f16") {
    return InvalidArgumentError("--kv-type must be f32 or f16, not '" + args.kv_type + "'");
  }
  // Opened before the tests, so that a path that cannot be written fails at once
  // instead of after minutes of benchmarking.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> json_file(nullptr, &std::fclose);
  if (!args.json_path.empty()) {
    json_file.reset(std::fopen(args.json_path.c_str(), "w"));
    if (!json_file) {
      return NotFoundError("cannot create --json file " + args.json_path + ": " +
                           std::strerror(errno));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(engine::LoadedModel loaded, engine::LoadModel(args.model_path));
  const model::LlamaModel& llama = *loaded.model;
  const model::ModelConfig& config = llama.config();
  const double weight_bytes = static_cast<double>(llama.weights().decode_bytes_per_token);
  const std::map<kernels::WeightType, int64_t>& weight_bytes_by_type =
      llama.weights().decode_bytes_by_type;
  std::printf(
      "model %s: %s, %lld layers, dim %lld, %lld experts, weights %.1f MiB, decode reads "
      "%.1f MiB/token, %lld-token tiles\n",
      args.model_path.c_str(), config.arch.c_str(), static_cast<long long>(config.num_layers),
      static_cast<long long>(config.dim), static_cast<long long>(config.num_experts),
      static_cast<double>(llama.weights().total_bytes) / (1 << 20), weight_bytes / (1 << 20),
      static_cast<long long>(llama.tile_tokens()));

  const kernels::KvType kv_type =
      args.kv_type == "f32" ? kernels::KvType::kF32 : kernels::KvType::kF16;
  const int64_t kv_capacity_tokens = std::max<int64_t>(
      *std::max_element(depths.begin(), depths.end()) + std::max(args.pp, args.tg), 2);
  TESSERA_ASSIGN_OR_RETURN(
      kv::KvCache cache,
      engine::CreateKvCache(llama, kv_type, /*block_size=*/16, kv_capacity_tokens));
  const double kv_bytes_per_position = static_cast<double>(cache.shape().BytesPerToken());

  std::vector<BenchRecord> records;
  // The probes (read bandwidth, the kernels' GEMV) run right before and right after
  // each thread count's tests (this VM's memory speed drifts over minutes: two probes
  // a minute apart may differ by a third, and both are printed), and their buffers
  // (256 MiB a thread, 128 MiB a weight type) must not count in the model's peak RSS:
  // the peak is read before each probe and reset after it. Where it cannot be reset
  // (checked here, before any probe), one probe per thread count waits until the end.
  const bool probe_each = args.tg > 0 && ResetPeakRss();
  int64_t peak_rss = 0;
  // threads -> bytes/s, each probe
  std::map<int, std::vector<double>> read_bandwidth, gemv_rate;
  const auto probe = [&](ThreadPool& pool) {
    const int threads = pool.num_threads();
    MemoryBandwidthOptions options;
    options.num_threads = threads;
    read_bandwidth[threads].push_back(MeasureMemoryBandwidth(options).read_bytes_per_s);
    gemv_rate[threads].push_back(KernelGemvRate(weight_bytes_by_type, pool));
  };
  const auto probe_between = [&](ThreadPool& pool) {
    if (!probe_each) return;
    peak_rss = std::max(peak_rss, PeakRssBytes());
    probe(pool);
    ResetPeakRss();
  };
  std::mt19937_64 rng(1234);
  for (const int64_t thread_count : thread_counts) {
    const int threads = static_cast<int>(thread_count);
    ThreadPool pool(threads);
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<engine::StageRunner> runner,
                             engine::StageRunner::CreateLocal(llama, cache, pool));
    engine::Driver driver(*runner);
    BenchSequence sequence(driver, config.vocab_size, rng);
    // Warm-up: one decode step reads every weight (faults the mapping in).
    TESSERA_RETURN_IF_ERROR(sequence.Refill(1));
    probe_between(pool);

    const auto record = [&](const char* kind, int64_t tokens, int64_t depth,
                            const std::vector<double>& seconds) -> BenchRecord& {
      BenchRecord& rec = records.emplace_back(BenchRecord{.test = TestName(kind, tokens, depth),
                                                          .depth = depth,
                                                          .threads = threads,
                                                          .tokens = tokens,
                                                          .seconds = Mean(seconds),
                                                          .seconds_sd = StdDev(seconds)});
      rec.tokens_per_s = static_cast<double>(tokens) / rec.seconds;
      return rec;
    };
    for (const int64_t depth : depths) {
      if (args.pp > 0) {
        std::vector<double> seconds;
        for (int r = 0; r < args.reps; ++r) {
          TESSERA_RETURN_IF_ERROR(sequence.Refill(depth));
          TESSERA_ASSIGN_OR_RETURN(double took, sequence.Step(args.pp));
          seconds.push_back(took);
        }
        record("pp", args.pp, depth, seconds);
      }
      if (args.tg > 0) {
        std::vector<double> seconds;
        for (int r = 0; r < args.reps; ++r) {
          TESSERA_RETURN_IF_ERROR(sequence.Refill(depth));
          double total = 0;
          for (int64_t i = 0; i < args.tg; ++i) {
            TESSERA_ASSIGN_OR_RETURN(double took, sequence.Step(1));
            total += took;
          }
          seconds.push_back(total);
        }
        BenchRecord& rec = record("tg", args.tg, depth, seconds);
        // Step i attends depth + i + 1 positions.
        rec.weight_bytes_per_token = weight_bytes;
        rec.kv_bytes_per_token = kv_bytes_per_position * (static_cast<double>(depth) +
                                                          0.5 * static_cast<double>(args.tg + 1));
        rec.implied_bytes_per_s = (weight_bytes + rec.kv_bytes_per_token) * rec.tokens_per_s;
      }
    }
    probe_between(pool);
  }
  peak_rss = std::max(peak_rss, PeakRssBytes());
  for (BenchRecord& rec : records) {
    if (!read_bandwidth.contains(rec.threads)) {
      ThreadPool pool(rec.threads);
      probe(pool);
    }
    rec.memory_read_probes = read_bandwidth[rec.threads];
    rec.memory_read_bytes_per_s = Mean(rec.memory_read_probes);
    rec.gemv_probes = gemv_rate[rec.threads];
    rec.gemv_bytes_per_s = Mean(rec.gemv_probes);
    if (rec.weight_bytes_per_token > 0) {
      rec.roofline_fraction =
          rec.tokens_per_s * (rec.weight_bytes_per_token / rec.gemv_bytes_per_s +
                              rec.kv_bytes_per_token / rec.memory_read_bytes_per_s);
    }
  }
  size_t name_width = 8;
  for (const BenchRecord& rec : records) name_width = std::max(name_width, rec.test.size());
  const int w = static_cast<int>(name_width);
  // roofline: against the kernels' GEMV rate (weights) and the read probe (KV cache);
  // of read bw: the bytes read per second against the read probe alone.
  std::printf("| %7s | %*s | %10s | %12s | %10s | %10s |\n", "threads", w, "test", "t/s", "+/- (s)",
              "roofline", "of read bw");
  std::printf("| ------: | %s: | ---------: | -----------: | ---------: | ---------: |\n",
              std::string(name_width - 1, '-').c_str());
  for (const BenchRecord& rec : records) {
    char roofline[32] = "-", of_read[32] = "-";
    if (rec.weight_bytes_per_token > 0) {
      std::snprintf(roofline, sizeof roofline, "%.0f%%", 100.0 * rec.roofline_fraction);
      std::snprintf(of_read, sizeof of_read, "%.0f%%",
                    100.0 * rec.implied_bytes_per_s / rec.memory_read_bytes_per_s);
    }
    std::printf("| %7d | %*s | %10.2f | %12.4f | %10s | %10s |\n", rec.threads, w, rec.test.c_str(),
                rec.tokens_per_s, rec.seconds_sd, roofline, of_read);
  }
  for (const BenchRecord& rec : records) {
    if (rec.weight_bytes_per_token == 0) continue;
    const auto before_after = [](const std::vector<double>& probes) {
      if (probes.size() != 2) return std::string();
      char text[64];
      std::snprintf(text, sizeof text, " (%.2f before the tests, %.2f after)", probes[0] / 1e9,
                    probes[1] / 1e9);
      return std::string(text);
    };
    std::printf(
        "%s, %d threads: %.2f GB/s of weights + %.2f GB/s of KV cache read vs the kernels' "
        "GEMV %.2f GB/s%s and the memory read probe %.2f GB/s%s\n",
        rec.test.c_str(), rec.threads, rec.weight_bytes_per_token * rec.tokens_per_s / 1e9,
        rec.kv_bytes_per_token * rec.tokens_per_s / 1e9, rec.gemv_bytes_per_s / 1e9,
        before_after(rec.gemv_probes).c_str(), rec.memory_read_bytes_per_s / 1e9,
        before_after(rec.memory_read_probes).c_str());
  }
  const int64_t mapped = static_cast<int64_t>(loaded.file->file_bytes());
  std::printf(
      "peak RSS %.1f MiB (model file %.1f MiB, mapped or repacked, + KV cache %.1f MiB = %.1f "
      "MiB)\n",
      static_cast<double>(peak_rss) / (1 << 20), static_cast<double>(mapped) / (1 << 20),
      static_cast<double>(cache.size_bytes()) / (1 << 20),
      static_cast<double>(mapped + cache.size_bytes()) / (1 << 20));

  if (json_file) {
    const std::string json = RecordsJson(records, args.model_path, mapped, args.kv_type);
    if (std::fputs(json.c_str(), json_file.get()) < 0 || std::fflush(json_file.get()) != 0) {
      return InternalError("writing " + args.json_path + " failed");
    }
  }
  return Status::Ok();
}

}  // namespace

void AddBenchModelCommand(CLI::App& bench, int* exit_code) {
  auto args = std::make_shared<BenchModelArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "model", "Prefill (pp) and generation (tg) speed of a model on one rank, llama-bench style");
  cmd->add_option("model", args->model_path, "GGUF model file or Hugging Face checkpoint directory")
      ->required();
  cmd->add_option("-t,--threads", args->threads, "Thread counts, comma-separated (e.g. 1,2)")
      ->capture_default_str();
  cmd->add_option("--pp", args->pp, "Prompt tokens of the pp test (0 skips it)")
      ->capture_default_str();
  cmd->add_option("--tg", args->tg, "Generated tokens of the tg test (0 skips it)")
      ->capture_default_str();
  cmd->add_option("-d,--depth", args->depths,
                  "Tokens of context before each test, comma-separated (llama-bench's -d)")
      ->capture_default_str();
  cmd->add_option("-r,--reps", args->reps, "Repetitions of each test")->capture_default_str();
  cmd->add_option("--kv-type", args->kv_type, "KV cache type: f32 or f16")->capture_default_str();
  cmd->add_option("--json", args->json_path, "Write the records as a JSON array to FILE");
  cmd->callback([args, exit_code] {
    Status status = RunBenchModel(*args);
    if (!status.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "tessera bench model: error: %s\n", status.ToString().c_str());
      *exit_code = 1;
      return;
    }
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
