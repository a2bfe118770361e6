#include "plan/cluster.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

using nlohmann::json;

std::string Num(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

Status CheckLink(const Link& link, std::string_view which) {
  if (!(link.bandwidth_gbps > 0)) {
    return InvalidArgumentError(std::string(which) + " bandwidth must be positive (got " +
                                Num(link.bandwidth_gbps) + " GB/s)");
  }
  if (!(link.latency_us >= 0)) {
    return InvalidArgumentError(std::string(which) + " latency must not be negative (got " +
                                Num(link.latency_us) + " us)");
  }
  return Status::Ok();
}

Result<Link> LinkFromValue(const json& j, std::string_view which) {
  if (j.is_string()) return ParseLinkSpec(j.get<std::string>());
  if (!j.is_object())
    return InvalidArgumentError(std::string(which) + ": expected a name or object");
  Link link;
  link.name = j.value("name", std::string("custom"));
  link.bandwidth_gbps = j.at("bandwidth_gbps").get<double>();
  link.latency_us = j.at("latency_us").get<double>();
  return link;
}

// {"q8_0": {"4": 10.2, "16": 4.1}}: GB/s by format and a count (token rows, integers
// >= 2; or columns, >= 1), `what` naming it in messages.
Status CountRatesFromValue(const json& j, const std::string& where, const char* what,
                           int64_t min_count,
                           std::map<std::string, std::map<int64_t, double>>* out) {
  for (const auto& [dtype, by_rows] : j.items()) {
    for (const auto& [rows, rate] : by_rows.items()) {
      int64_t n = 0;
      const auto [end, ec] = std::from_chars(rows.data(), rows.data() + rows.size(), n);
      if (ec != std::errc() || end != rows.data() + rows.size() || n < min_count) {
        return InvalidArgumentError(where + "." + dtype + ": " + what + " '" + rows +
                                    "' must be an integer >= " + std::to_string(min_count));
      }
      if (!(rate.get<double>() > 0)) {
        return InvalidArgumentError(where + "." + dtype + "." + rows + " must be positive");
      }
      (*out)[dtype][n] = rate.get<double>();
    }
  }
  return Status::Ok();
}

json CountRatesToValue(const std::map<std::string, std::map<int64_t, double>>& rates) {
  json j = json::object();
  for (const auto& [dtype, by_rows] : rates) {
    for (const auto& [n, gbps] : by_rows) j[dtype][std::to_string(n)] = gbps;
  }
  return j;
}

Result<DeviceSpec> DeviceFromValue(const json& j) {
  if (j.is_string()) return DevicePreset(j.get<std::string>());
  if (!j.is_object()) return InvalidArgumentError("device: expected a name or object");
  DeviceSpec d;
  d.name = j.value("name", std::string("custom"));
  d.memory_gb = j.at("memory_gb").get<double>();
  d.memory_bandwidth_gbps = j.at("memory_bandwidth_gbps").get<double>();
  d.tflops = j.at("tflops").get<double>();
  for (const char* key : {"gemv_gbps", "gemm_tflops"}) {
    if (!j.contains(key)) continue;
    std::map<std::string, double>& rates = key[3] == 'v' ? d.gemv_gbps : d.gemm_tflops;
    for (const auto& [dtype, rate] : j.at(key).items()) {
      if (!(rate.get<double>() > 0)) {
        return InvalidArgumentError(std::string("device ") + key + "." + dtype +
                                    " must be positive");
      }
      rates[dtype] = rate.get<double>();
    }
  }
  if (j.contains("rows_gemv_gbps")) {
    TESSERA_RETURN_IF_ERROR(CountRatesFromValue(j.at("rows_gemv_gbps"), "device rows_gemv_gbps",
                                                "row count", 2, &d.rows_gemv_gbps));
  }
  if (j.contains("gemv_call_us")) {
    for (const auto& [dtype, us] : j.at("gemv_call_us").items()) {
      if (!(us.get<double>() >= 0)) {
        return InvalidArgumentError("device gemv_call_us." + dtype + " must not be negative");
      }
      d.gemv_call_us[dtype] = us.get<double>();
    }
  }
  if (j.contains("gemv_cols_gbps")) {
    TESSERA_RETURN_IF_ERROR(CountRatesFromValue(j.at("gemv_cols_gbps"), "device gemv_cols_gbps",
                                                "column count", 1, &d.gemv_cols_gbps));
  }
  return d;
}

}  // namespace

double DeviceSpec::WeightReadGbps(const std::string& dtype) const {
  auto it = gemv_gbps.find(dtype);
  return it == gemv_gbps.end() ? memory_bandwidth_gbps
                               : std::min(it->second, memory_bandwidth_gbps);
}

double DeviceSpec::MatMulTflops(const std::string& dtype) const {
  auto it = gemm_tflops.find(dtype);
  return it == gemm_tflops.end() ? tflops : it->second;
}

double DeviceRates::WeightReadGbpsForRows(double rows) const {
  if (rows <= 1 || rows_read_gbps.empty()) return rows <= 1 ? weight_read_gbps : 0;
  double lo_rows = 1, lo_gbps = weight_read_gbps;
  for (const auto& [n, gbps] : rows_read_gbps) {
    const double hi_rows = static_cast<double>(n);
    if (rows <= hi_rows) {
      const double f = (rows - lo_rows) / (hi_rows - lo_rows);
      const double seconds_per_gb = (1 - f) / lo_gbps + f / gbps;
      return 1 / seconds_per_gb;
    }
    lo_rows = hi_rows;
    lo_gbps = gbps;
  }
  return 0;
}

namespace {

// Seconds per byte of a call that streams `bytes` at `gbps` as measured, its fixed
// `call_seconds` taken out (never below a quarter of the time: a cost fitted from
// noisy timings must not leave a call nothing to stream with).
double StreamSecondsPerByte(double bytes, double gbps, double call_seconds) {
  const double seconds = bytes / (gbps * 1e9);
  return std::max(seconds - call_seconds, seconds / 4) / bytes;
}

}  // namespace

double DeviceRates::ColumnsFactor(double cols, double bytes_per_elem) const {
  if (cols_read_gbps.size() < 2) return 1;
  // Seconds per byte at `c` columns: linear in log2(c) between the measured counts.
  const auto at = [&](std::map<int64_t, double>::const_iterator it) {
    const double bytes = static_cast<double>(kGemvRows * it->first) * bytes_per_elem;
    return StreamSecondsPerByte(bytes, it->second, call_seconds);
  };
  const auto seconds_per_byte = [&](double c) {
    const auto hi = cols_read_gbps.lower_bound(static_cast<int64_t>(std::ceil(c)));
    if (hi == cols_read_gbps.begin()) return at(hi);
    if (hi == cols_read_gbps.end()) return at(std::prev(hi));
    const auto lo = std::prev(hi);
    const double f = std::log2(c / static_cast<double>(lo->first)) /
                     std::log2(static_cast<double>(hi->first) / static_cast<double>(lo->first));
    return (1 - f) * at(lo) + f * at(hi);
  };
  return seconds_per_byte(static_cast<double>(kGemvCols)) / seconds_per_byte(cols);
}

double DeviceRates::SecondsPerWeightByte(double gbps, double cols, double bytes_per_elem) const {
  const double matrix_bytes = static_cast<double>(kGemvRows * kGemvCols) * bytes_per_elem;
  return StreamSecondsPerByte(matrix_bytes, gbps, call_seconds) /
         ColumnsFactor(cols, bytes_per_elem);
}

int64_t Cluster::ThreadsPerDevice() const {
  if (cpu.cores <= 0) return 1;
  return std::max<int64_t>(1, cpu.cores / std::max<int64_t>(1, devices_per_node));
}

DeviceRates Cluster::RatesOf(const std::string& weight_dtype, int64_t busy_devices) const {
  DeviceRates r;
  if (auto cols = device.gemv_cols_gbps.find(weight_dtype); cols != device.gemv_cols_gbps.end()) {
    r.cols_read_gbps = cols->second;
  }
  if (auto call = device.gemv_call_us.find(weight_dtype); call != device.gemv_call_us.end()) {
    r.call_seconds = call->second * 1e-6;
  }
  if (cpu.cores <= 0) {
    r.weight_read_gbps = device.WeightReadGbps(weight_dtype);
    r.matmul_tflops = device.MatMulTflops(weight_dtype);
    r.memory_gbps = device.memory_bandwidth_gbps;
    r.memory_gb = device.memory_gb;
    return r;
  }
  r.threads = ThreadsPerDevice();
  const double threads = static_cast<double>(r.threads);
  const int64_t busy = std::clamp<int64_t>(busy_devices, 1, std::max<int64_t>(1, devices_per_node));
  const double thread_read =
      cpu.thread_read_gbps > 0 ? cpu.thread_read_gbps : device.memory_bandwidth_gbps;
  const double node_read = cpu.node_read_gbps > 0 ? cpu.node_read_gbps : thread_read * cpu.cores;
  r.memory_gbps = std::min(threads * thread_read, node_read / static_cast<double>(busy));
  // Weights stream at the kernel's own measured GEMV rate: the read probe is another
  // access pattern, which reads slower than the GEMV on some machines (an Intel Xeon
  // VM: 18 GB/s against the Q8_0 GEMV's 24) and faster on others, so it bounds the
  // weights only where the kernel was not measured on every core together. The cores
  // that compute at once share the node's measured all-core GEMV rate.
  auto gemv = device.gemv_gbps.find(weight_dtype);
  auto all = cpu.node_gemv_gbps.find(weight_dtype);
  const double active = std::min<double>(static_cast<double>(busy) * threads,
                                         static_cast<double>(std::max<int64_t>(1, cpu.cores)));
  if (gemv == device.gemv_gbps.end()) {
    r.weight_read_gbps = r.memory_gbps;
  } else if (all == cpu.node_gemv_gbps.end()) {
    r.weight_read_gbps = std::min(threads * gemv->second, r.memory_gbps);
  } else {
    r.weight_read_gbps = std::min(threads * gemv->second, threads * all->second / active);
  }
  // A rank with several threads runs each matmul on its pool: the pool's sweep.
  if (auto cols = cpu.node_gemv_cols_gbps.find(weight_dtype);
      r.threads > 1 && cols != cpu.node_gemv_cols_gbps.end()) {
    r.cols_read_gbps = cols->second;
  }
  if (auto call = cpu.node_gemv_call_us.find(weight_dtype);
      r.threads > 1 && call != cpu.node_gemv_call_us.end()) {
    r.call_seconds = call->second * 1e-6;
  }
  r.matmul_tflops = threads * device.MatMulTflops(weight_dtype);
  r.memory_gb = threads * device.memory_gb;
  if (auto rows = device.rows_gemv_gbps.find(weight_dtype); rows != device.rows_gemv_gbps.end()) {
    const auto all_rows = cpu.node_rows_gemv_gbps.find(weight_dtype);
    for (const auto& [n, gbps] : rows->second) {
      double rate = std::min(threads * gbps, r.weight_read_gbps);
      if (all_rows != cpu.node_rows_gemv_gbps.end()) {
        if (auto at = all_rows->second.find(n); at != all_rows->second.end()) {
          rate = std::min(rate, threads * at->second / active);
        }
      }
      r.rows_read_gbps[n] = rate;
    }
  }
  return r;
}

Status ValidateCluster(const Cluster& c) {
  const std::string where = "cluster '" + c.name + "'";
  if (c.nodes <= 0) {
    return InvalidArgumentError(where + ": nodes must be positive (got " + std::to_string(c.nodes) +
                                ")");
  }
  if (c.devices_per_node <= 0) {
    return InvalidArgumentError(where + ": devices_per_node must be positive (got " +
                                std::to_string(c.devices_per_node) + ")");
  }
  if (!(c.device.memory_gb > 0)) {
    return InvalidArgumentError(where + ": device memory must be positive (got " +
                                Num(c.device.memory_gb) + " GB)");
  }
  if (!(c.device.memory_bandwidth_gbps > 0)) {
    return InvalidArgumentError(where + ": device memory bandwidth must be positive (got " +
                                Num(c.device.memory_bandwidth_gbps) + " GB/s)");
  }
  if (!(c.device.tflops > 0)) {
    return InvalidArgumentError(where + ": device FLOP/s must be positive (got " +
                                Num(c.device.tflops) + " TFLOP/s)");
  }
  if (c.cpu.cores < 0 || c.cpu.thread_read_gbps < 0 || c.cpu.node_read_gbps < 0) {
    return InvalidArgumentError(where + ": cpu figures must not be negative");
  }
  if (c.cpu.cores > 0 && c.devices_per_node > c.cpu.cores) {
    return InvalidArgumentError(where + ": " + std::to_string(c.devices_per_node) +
                                " devices (ranks) per node exceed its " +
                                std::to_string(c.cpu.cores) + " cores");
  }
  if (c.devices_per_node > 1)
    TESSERA_RETURN_IF_ERROR(CheckLink(c.intra_link, where + ": intra_link"));
  if (c.nodes > 1) TESSERA_RETURN_IF_ERROR(CheckLink(c.inter_link, where + ": inter_link"));
  return Status::Ok();
}

Result<Link> ParseLinkSpec(std::string_view spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos) return LinkPreset(spec);
  const std::string bw_text(spec.substr(0, colon));
  const std::string lat_text(spec.substr(colon + 1));
  char* end = nullptr;
  Link link;
  link.name = std::string(spec);
  link.bandwidth_gbps = std::strtod(bw_text.c_str(), &end);
  const bool bw_ok = !bw_text.empty() && *end == '\0';
  link.latency_us = std::strtod(lat_text.c_str(), &end);
  const bool lat_ok = !lat_text.empty() && *end == '\0';
  if (!bw_ok || !lat_ok) {
    return InvalidArgumentError("link '" + std::string(spec) +
                                "': expected a preset name or BANDWIDTH_GBPS:LATENCY_US");
  }
  TESSERA_RETURN_IF_ERROR(CheckLink(link, "link '" + std::string(spec) + "'"));
  return link;
}

Result<Cluster> ParseClusterJson(std::string_view json_text, std::string_view origin) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(std::string(origin) + ": not a JSON object");
  }
  Cluster c;
  try {
    c.name = j.value("name", std::string(origin));
    c.nodes = j.value("nodes", int64_t{1});
    c.devices_per_node = j.value("devices_per_node", int64_t{1});
    Result<DeviceSpec> device = DeviceFromValue(j.at("device"));
    if (!device.ok()) return device.status().WithContext(origin);
    c.device = *device;
    const json intra = j.contains("intra_link") ? j["intra_link"] : json("shm");
    const json inter = j.contains("inter_link") ? j["inter_link"] : json("1gbe");
    Result<Link> intra_link = LinkFromValue(intra, "intra_link");
    if (!intra_link.ok()) return intra_link.status().WithContext(origin);
    Result<Link> inter_link = LinkFromValue(inter, "inter_link");
    if (!inter_link.ok()) return inter_link.status().WithContext(origin);
    c.intra_link = *intra_link;
    c.inter_link = *inter_link;
    if (j.contains("cpu")) {
      const json& cpu = j["cpu"];
      c.cpu.cores = cpu.at("cores").get<int64_t>();
      c.cpu.thread_read_gbps = cpu.value("thread_read_gbps", 0.0);
      c.cpu.node_read_gbps = cpu.value("node_read_gbps", 0.0);
      if (cpu.contains("node_gemv_gbps")) {
        for (const auto& [dtype, rate] : cpu.at("node_gemv_gbps").items()) {
          if (!(rate.get<double>() > 0)) {
            return InvalidArgumentError(std::string(origin) + ": cpu.node_gemv_gbps." + dtype +
                                        " must be positive");
          }
          c.cpu.node_gemv_gbps[dtype] = rate.get<double>();
        }
      }
      if (cpu.contains("node_rows_gemv_gbps")) {
        Status s = CountRatesFromValue(cpu.at("node_rows_gemv_gbps"), "cpu.node_rows_gemv_gbps",
                                       "row count", 2, &c.cpu.node_rows_gemv_gbps);
        if (!s.ok()) return s.WithContext(origin);
      }
      if (cpu.contains("node_gemv_call_us")) {
        for (const auto& [dtype, us] : cpu.at("node_gemv_call_us").items()) {
          if (!(us.get<double>() >= 0)) {
            return InvalidArgumentError(std::string(origin) + ": cpu.node_gemv_call_us." + dtype +
                                        " must not be negative");
          }
          c.cpu.node_gemv_call_us[dtype] = us.get<double>();
        }
      }
      if (cpu.contains("node_gemv_cols_gbps")) {
        Status s = CountRatesFromValue(cpu.at("node_gemv_cols_gbps"), "cpu.node_gemv_cols_gbps",
                                       "column count", 1, &c.cpu.node_gemv_cols_gbps);
        if (!s.ok()) return s.WithContext(origin);
      }
    } else if (j.contains("measured") && j["measured"].is_object() &&
               j["measured"].contains("threads")) {
      // A file from --calibrate: one device per core, with its measured read rates.
      const json& m = j["measured"];
      c.cpu.cores = m.at("threads").get<int64_t>();
      c.cpu.thread_read_gbps = m.value("read_bytes_per_s_1_thread", 0.0) / 1e9;
      c.cpu.node_read_gbps = m.value("read_bytes_per_s_all", 0.0) / 1e9;
    }
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string(origin) + ": " + e.what());
  }
  TESSERA_RETURN_IF_ERROR(ValidateCluster(c));
  return c;
}

Result<Cluster> LoadClusterFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open cluster file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseClusterJson(text.str(), path);
}

std::string ClusterToJson(const Cluster& c, std::string_view extra_json) {
  json j;
  j["name"] = c.name;
  j["nodes"] = c.nodes;
  j["devices_per_node"] = c.devices_per_node;
  j["device"] = {{"name", c.device.name},
                 {"memory_gb", c.device.memory_gb},
                 {"memory_bandwidth_gbps", c.device.memory_bandwidth_gbps},
                 {"tflops", c.device.tflops}};
  if (!c.device.gemv_gbps.empty()) j["device"]["gemv_gbps"] = c.device.gemv_gbps;
  if (!c.device.gemm_tflops.empty()) j["device"]["gemm_tflops"] = c.device.gemm_tflops;
  if (!c.device.rows_gemv_gbps.empty()) {
    j["device"]["rows_gemv_gbps"] = CountRatesToValue(c.device.rows_gemv_gbps);
  }
  if (!c.device.gemv_cols_gbps.empty()) {
    j["device"]["gemv_cols_gbps"] = CountRatesToValue(c.device.gemv_cols_gbps);
  }
  if (!c.device.gemv_call_us.empty()) j["device"]["gemv_call_us"] = c.device.gemv_call_us;
  j["intra_link"] = {{"name", c.intra_link.name},
                     {"bandwidth_gbps", c.intra_link.bandwidth_gbps},
                     {"latency_us", c.intra_link.latency_us}};
  j["inter_link"] = {{"name", c.inter_link.name},
                     {"bandwidth_gbps", c.inter_link.bandwidth_gbps},
                     {"latency_us", c.inter_link.latency_us}};
  if (c.cpu.cores > 0) {
    j["cpu"] = {{"cores", c.cpu.cores},
                {"thread_read_gbps", c.cpu.thread_read_gbps},
                {"node_read_gbps", c.cpu.node_read_gbps}};
    if (!c.cpu.node_gemv_gbps.empty()) j["cpu"]["node_gemv_gbps"] = c.cpu.node_gemv_gbps;
    if (!c.cpu.node_rows_gemv_gbps.empty()) {
      j["cpu"]["node_rows_gemv_gbps"] = CountRatesToValue(c.cpu.node_rows_gemv_gbps);
    }
    if (!c.cpu.node_gemv_cols_gbps.empty()) {
      j["cpu"]["node_gemv_cols_gbps"] = CountRatesToValue(c.cpu.node_gemv_cols_gbps);
    }
    if (!c.cpu.node_gemv_call_us.empty()) j["cpu"]["node_gemv_call_us"] = c.cpu.node_gemv_call_us;
  }
  if (!extra_json.empty()) j["measured"] = json::parse(extra_json);
  return j.dump(2) + "\n";
}

}  // namespace tessera::plan
