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

  // Rates for weights of `dtype`: the measured kernel rate when there is one (never
  // above the memory bandwidth), else the device's figure.
  double WeightReadGbps(const std::string& dtype) const;
  double MatMulTflops(const std::string& dtype) const;
};

struct Cluster {
  std::string name;
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  Link intra_link;  // between devices of one node
  Link inter_link;  // between nodes

  int64_t total_devices() const { return nodes * devices_per_node; }
};

// InvalidArgument naming the impossible figure: "cluster 'x': inter_link bandwidth
// must be positive (got 0 GB/s)".
Status ValidateCluster(const Cluster& cluster);

// Parses "nvlink", "1gbe" (presets) or "BW_GBPS:LAT_US" ("12.5:3") into a Link.
Result<Link> ParseLinkSpec(std::string_view spec);

// Reads a cluster JSON file (see docs/plan.md for the fields); device and links may
// name presets or give figures. The result is validated.
Result<Cluster> LoadClusterFile(const std::string& path);
Result<Cluster> ParseClusterJson(std::string_view json_text, std::string_view origin);

// The JSON text of a cluster file for `cluster`, with `extra_json` (an object, may be
// empty) stored under "measured".
std::string ClusterToJson(const Cluster& cluster, std::string_view extra_json);

}  // namespace tessera::plan
