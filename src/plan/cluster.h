// Cluster: the machines a model is planned onto: nodes × devices per node, each
// device's memory, memory bandwidth and FLOP/s, and the intra- and inter-node links
// as alpha-beta (latency + bandwidth). Layer: plan (pure data). Built from presets
// (presets.h), a cluster JSON file (written by hand or by `tessera plan --calibrate`)
// and command-line overrides.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/status.h"

namespace tessera::plan {

// One link kind as the alpha-beta model sees it: sending m bytes takes
// latency_us·1e-6 + m / (bandwidth_gbps·1e9) seconds.
struct Link {
  std::string name;
  double bandwidth_gbps = 0;  // GB/s (1e9 bytes/s) one device sends in one direction
  double latency_us = 0;      // alpha: one-way small-message time

  double SecondsFor(double bytes) const {
    return latency_us * 1e-6 + bytes / (bandwidth_gbps * 1e9);
  }
};

struct DeviceSpec {
  std::string name;
  double memory_gb = 0;              // 1e9 bytes
  double memory_bandwidth_gbps = 0;  // GB/s
  double tflops = 0;                 // dense FLOP/s at the compute dtype, 1e12
  // Measured kernel rates by weight format ("q8_0", "f16", …), from --calibrate:
  // weight bytes a GEMV streams per second (a decode step may be bound by the
  // dequantising dot products rather than by memory), and GEMM TFLOP/s.
  std::map<std::string, double> gemv_gbps;
  std::map<std::string, double> gemm_tflops;
  // Weight bytes per second of a matmul over a few token rows (a decode batch or a
  // pipeline micro-batch), streaming from memory, by format and row count
  // ({"q8_0": {4: 10.2, 16: 4.1}}): between one row (gemv_gbps) and a prefill's
  // GEMM a CPU kernel is bound by its dequantising dot products, not by memory.
  std::map<std::string, std::map<int64_t, double>> rows_gemv_gbps;
  // The one-row GEMV by row length ({"q8_0": {512: 24, 1024: 27, 2048: 29, 4096: 31}}),
  // measured side by side so that they compare: a matrix of `cols` columns streams at
  // gemv_gbps × rate(cols) / rate(kGemvCols) (DeviceRates::ColumnsFactor).
  std::map<std::string, std::map<int64_t, double>> gemv_cols_gbps;
  // What one matmul call costs besides its bytes, microseconds by format (fitted from
  // 2048- and 256-row matrices of 2048 columns): a model of small matrices pays it
  // often.
  std::map<std::string, double> gemv_call_us;

  // Rates for weights of `dtype`: the measured kernel rate when there is one (never
  // above the memory bandwidth), else the device's figure.
  double WeightReadGbps(const std::string& dtype) const;
  double MatMulTflops(const std::string& dtype) const;
};

// The matrices gemv_gbps is measured on (kernels/rate_probe.h): kGemvRows × kGemvCols,
// one call each.
inline constexpr int64_t kGemvRows = 2048;
inline constexpr int64_t kGemvCols = 2048;

// A CPU node as `tessera plan --calibrate` measures it. With `cores` > 0 a device
// is one rank: it computes with cores / devices_per_node threads (tessera generate's
// default), the device's kernel rates (gemv_gbps, gemm_tflops, tflops) are one
// thread's and scale with its threads, its memory is memory_gb per core, and the
// ranks that compute at the same time share the node's read bandwidth.
struct CpuNode {
  int64_t cores = 0;            // 0: not a CPU node; the device figures are whole-device
  double thread_read_gbps = 0;  // memory one thread reads with the other cores idle
  double node_read_gbps = 0;    // memory all cores read together
  // GEMV weight bytes per second of all cores running the kernel together, by
  // weight format (--calibrate): what decode really streams when every core works,
  // which is below cores × one thread's rate on machines whose cores share more
  // than memory bandwidth.
  std::map<std::string, double> node_gemv_gbps;
  // The same for a few token rows (DeviceSpec::rows_gemv_gbps), every core at once.
  std::map<std::string, std::map<int64_t, double>> node_rows_gemv_gbps;
  // The same by row length (DeviceSpec::gemv_cols_gbps), every core in one pool, and
  // that pool's cost per call (DeviceSpec::gemv_call_us).
  std::map<std::string, std::map<int64_t, double>> node_gemv_cols_gbps;
  std::map<std::string, double> node_gemv_call_us;
};

// What one device sustains while `busy_devices` devices of its node compute at once.
struct DeviceRates {
  int64_t threads = 1;
  double weight_read_gbps = 0;  // the GEMV rate for the weight format, capped by memory_gbps
  double matmul_tflops = 0;
  double memory_gbps = 0;  // KV and other traffic
  double memory_gb = 0;
  // The measured few-row rates (DeviceSpec::rows_gemv_gbps) for this device's threads,
  // capped like weight_read_gbps; row count -> GB/s, ascending.
  std::map<int64_t, double> rows_read_gbps;

  // Weight bytes per second of a matmul over `rows` token rows: weight_read_gbps at
  // one row; between measured row counts the time per byte is interpolated linearly
  // in rows (a kernel pays per byte a fixed part and a part per row). Past the
  // largest measured count (or with none) 0: the caller's roofline (weight bytes at
  // weight_read_gbps against FLOPs at matmul_tflops) applies.
  double WeightReadGbpsForRows(double rows) const;

  // The GEMV by row length for this device's threads (DeviceSpec::gemv_cols_gbps, or
  // the node's for a rank with several threads); columns -> GB/s.
  std::map<int64_t, double> cols_read_gbps;
  // A matmul call's fixed cost for this device's threads (gemv_call_us, or the
  // node's), seconds.
  double call_seconds = 0;

  // How fast the bytes of a matrix of `cols` columns stream against those of the
  // kGemvRows × kGemvCols matrices the rates are measured on, with each measured
  // call's fixed cost (call_seconds) taken out of its time: time per byte interpolated
  // linearly in log2(cols) between the measured row lengths and held at the ends; 1
  // without a measured sweep. bytes_per_elem: the weight format's.
  double ColumnsFactor(double cols, double bytes_per_elem) const;
  // Seconds per weight byte of a `cols`-column matrix when the weights stream at `gbps`
  // as measured (kGemvRows × kGemvCols matrices, one call each): the call cost taken
  // out, ColumnsFactor applied. A pass adds call_seconds per matmul call.
  double SecondsPerWeightByte(double gbps, double cols, double bytes_per_elem) const;
};

struct Cluster {
  std::string name;
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  Link intra_link;  // between devices of one node
  Link inter_link;  // between nodes
  CpuNode cpu;

  int64_t total_devices() const { return nodes * devices_per_node; }
  // Threads of one rank on a CPU node (1 otherwise).
  int64_t ThreadsPerDevice() const;
  DeviceRates RatesOf(const std::string& weight_dtype, int64_t busy_devices) const;
};

// InvalidArgument naming the impossible figure: "cluster 'x': inter_link bandwidth
// must be positive (got 0 GB/s)".
Status ValidateCluster(const Cluster& cluster);

// Parses "nvlink", "1gbe" (presets) or "BW_GBPS:LAT_US" ("12.5:3") into a Link.
Result<Link> ParseLinkSpec(std::string_view spec);

// Reads a cluster JSON file (see docs/plan.md for the fields); device and links may
// name presets or give figures; "cpu" ({cores, thread_read_gbps, node_read_gbps}),
// or else the "measured" block --calibrate writes (threads, read_bytes_per_s_1_thread,
// read_bytes_per_s_all), makes it a CPU node. The result is validated.
Result<Cluster> LoadClusterFile(const std::string& path);
Result<Cluster> ParseClusterJson(std::string_view json_text, std::string_view origin);

// The JSON text of a cluster file for `cluster`, with `extra_json` (an object, may be
// empty) stored under "measured".
std::string ClusterToJson(const Cluster& cluster, std::string_view extra_json);

}  // namespace tessera::plan
