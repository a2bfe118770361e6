#include "plan/cluster.h"

#include <gtest/gtest.h>

#include <cmath>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

TEST(ClusterTest, PresetsValidate) {
  for (const std::string& name : ClusterPresetNames()) {
    Result<Cluster> c = ClusterPreset(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
  }
  const Cluster c = *ClusterPreset("2x8xh100-ib");
  EXPECT_EQ(c.total_devices(), 16);
  EXPECT_EQ(c.intra_link.name, "nvlink");
  EXPECT_EQ(c.inter_link.name, "infiniband");
}

TEST(ClusterTest, ImpossibleClustersNameTheFigure) {
  Cluster c = *ClusterPreset("2x8xh100-ib");
  c.inter_link.bandwidth_gbps = 0;
  Status s = ValidateCluster(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inter_link bandwidth must be positive"), std::string::npos)
      << s.message();
  c = *ClusterPreset("8xh100");
  c.device.memory_gb = -80;
  s = ValidateCluster(c);
  EXPECT_NE(s.message().find("device memory must be positive (got -80 GB)"), std::string::npos)
      << s.message();
  c = *ClusterPreset("8xh100");
  c.nodes = 0;
  EXPECT_NE(ValidateCluster(c).message().find("nodes must be positive"), std::string::npos);
  // A one-node cluster never uses its inter-node link, so it may be anything.
  c = *ClusterPreset("8xh100");
  c.inter_link.bandwidth_gbps = 0;
  EXPECT_TRUE(ValidateCluster(c).ok());
}

TEST(ClusterTest, LinkSpecs) {
  EXPECT_DOUBLE_EQ(ParseLinkSpec("1gbe")->bandwidth_gbps, 0.117);
  const Link l = *ParseLinkSpec("12.5:3");
  EXPECT_DOUBLE_EQ(l.bandwidth_gbps, 12.5);
  EXPECT_DOUBLE_EQ(l.latency_us, 3);
  EXPECT_EQ(ParseLinkSpec("0:3").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLinkSpec("5:-1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLinkSpec("fast:x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLinkSpec("carrier-pigeon").status().code(), StatusCode::kNotFound);
  EXPECT_NEAR(l.SecondsFor(12.5e9), 1.000003, 1e-12);
}

TEST(ClusterTest, JsonRoundTrip) {
  const Cluster c = *ClusterPreset("4xdesktop-1gbe");
  const std::string text = ClusterToJson(c, R"({"note": "x"})");
  Result<Cluster> back = ParseClusterJson(text, "round trip");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->nodes, 4);
  EXPECT_DOUBLE_EQ(back->inter_link.bandwidth_gbps, c.inter_link.bandwidth_gbps);
  EXPECT_DOUBLE_EQ(back->device.tflops, c.device.tflops);
  // Presets by name inside a file; a bad figure is refused.
  EXPECT_TRUE(
      ParseClusterJson(R"({"nodes": 2, "device": "a100-80g", "inter_link": "10gbe"})", "f").ok());
  Result<Cluster> bad = ParseClusterJson(
      R"({"nodes": 2, "device": {"memory_gb": -1, "memory_bandwidth_gbps": 1, "tflops": 1}})",
      "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("memory must be positive"), std::string::npos);
  EXPECT_FALSE(ParseClusterJson(R"({"device": "tpu-v9"})", "f").ok());
  EXPECT_EQ(LoadClusterFile("/nonexistent/cluster.json").status().code(), StatusCode::kNotFound);
}

TEST(ClusterTest, MeasuredKernelRatesRoundTripAndCap) {
  Cluster c = *ClusterPreset("4xdesktop-1gbe");
  c.device.gemv_gbps = {{"q8_0", 12.5}, {"f32", 80}};
  c.device.gemm_tflops = {{"q8_0", 0.2}};
  Result<Cluster> back = ParseClusterJson(ClusterToJson(c, ""), "rates");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->device.gemv_gbps, c.device.gemv_gbps);
  EXPECT_DOUBLE_EQ(back->device.WeightReadGbps("q8_0"), 12.5);
  EXPECT_DOUBLE_EQ(back->device.WeightReadGbps("f32"), 40);  // capped by memory bandwidth
  EXPECT_DOUBLE_EQ(back->device.WeightReadGbps("f16"), 40);  // not measured: the device's
  EXPECT_DOUBLE_EQ(back->device.MatMulTflops("q8_0"), 0.2);
  EXPECT_DOUBLE_EQ(back->device.MatMulTflops("bf16"), 0.4);
  Result<Cluster> bad = ParseClusterJson(
      R"({"device": {"memory_gb": 1, "memory_bandwidth_gbps": 1, "tflops": 1,
                     "gemv_gbps": {"q8_0": 0}}})",
      "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gemv_gbps.q8_0 must be positive"), std::string::npos);
}

// A calibrated 2-core node (one rank per core): rates are one thread's, ranks that
// compute at once share the all-core figures, and a few-row matmul streams its
// weights at the measured per-row-count rate, interpolated in time per byte.
TEST(ClusterTest, CpuNodeRatesForFewRows) {
  Cluster c;
  c.name = "two-cores";
  c.devices_per_node = 2;
  c.device = {"core", 12, 20, 0.05, {{"q8_0", 16}}, {{"q8_0", 0.06}}};
  c.device.rows_gemv_gbps = {{"q8_0", {{4, 8}, {16, 2}}}};
  c.cpu.cores = 2;
  c.cpu.thread_read_gbps = 18;
  c.cpu.node_read_gbps = 28;
  c.cpu.node_gemv_gbps = {{"q8_0", 24}};
  c.cpu.node_rows_gemv_gbps = {{"q8_0", {{4, 12}}}};
  c.intra_link = *LinkPreset("shm");
  c.inter_link = *LinkPreset("1gbe");
  Result<Cluster> back = ParseClusterJson(ClusterToJson(c, ""), "rows");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->device.rows_gemv_gbps, c.device.rows_gemv_gbps);
  EXPECT_EQ(back->cpu.node_rows_gemv_gbps, c.cpu.node_rows_gemv_gbps);

  const DeviceRates alone = back->RatesOf("q8_0", 1);
  EXPECT_DOUBLE_EQ(alone.weight_read_gbps, 16);
  EXPECT_DOUBLE_EQ(alone.WeightReadGbpsForRows(1), 16);
  EXPECT_DOUBLE_EQ(alone.WeightReadGbpsForRows(4), 8);
  EXPECT_DOUBLE_EQ(alone.WeightReadGbpsForRows(16), 2);
  // 10 rows: halfway from 4 to 16 in time per byte (1/8 and 1/2 s/GB).
  EXPECT_DOUBLE_EQ(alone.WeightReadGbpsForRows(10), 1 / (0.5 / 8 + 0.5 / 2));
  EXPECT_DOUBLE_EQ(alone.WeightReadGbpsForRows(17), 0);  // past the measured: the roofline's
  // Both cores busy: each gets half the all-core rates (24 / 2 for one row, 12 / 2 for 4).
  const DeviceRates shared = back->RatesOf("q8_0", 2);
  EXPECT_DOUBLE_EQ(shared.weight_read_gbps, 12);
  EXPECT_DOUBLE_EQ(shared.WeightReadGbpsForRows(4), 6);
  EXPECT_DOUBLE_EQ(shared.WeightReadGbpsForRows(16), 2);  // no all-core figure: one thread's
  EXPECT_DOUBLE_EQ(back->RatesOf("f16", 1).WeightReadGbpsForRows(4), 0);  // none measured

  // A machine whose read probe (18 GB/s a thread) reads slower than its GEMV (24 on
  // one thread, 30 on both cores): the weights stream at the kernel's measured rates,
  // not at the probe's; the KV cache at the probe's. Without the all-core GEMV figure
  // (an older file), the read probe still bounds them.
  Cluster fast = *back;
  fast.device.gemv_gbps["q8_0"] = 24;
  fast.cpu.node_gemv_gbps["q8_0"] = 30;
  EXPECT_DOUBLE_EQ(fast.RatesOf("q8_0", 1).weight_read_gbps, 24);
  EXPECT_DOUBLE_EQ(fast.RatesOf("q8_0", 1).memory_gbps, 18);
  EXPECT_DOUBLE_EQ(fast.RatesOf("q8_0", 2).weight_read_gbps, 15);
  fast.devices_per_node = 1;  // one rank, both cores' threads
  EXPECT_DOUBLE_EQ(fast.RatesOf("q8_0", 1).weight_read_gbps, 30);
  fast.devices_per_node = 2;
  fast.cpu.node_gemv_gbps.clear();
  EXPECT_DOUBLE_EQ(fast.RatesOf("q8_0", 1).weight_read_gbps, 18);

  Result<Cluster> bad = ParseClusterJson(
      R"({"device": {"memory_gb": 1, "memory_bandwidth_gbps": 1, "tflops": 1,
                     "rows_gemv_gbps": {"q8_0": {"four": 2}}}})",
      "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("row count 'four' must be an integer >= 2"),
            std::string::npos)
      << bad.status().ToString();
}

// The one-row GEMV by row length: a matrix of c columns streams at rate(c) /
// rate(2048) of the measured weight rate, time per byte linear in log2(c) between the
// measured lengths and held beyond them; a rank with every core's threads takes the
// pool's sweep; a type without a sweep streams at the plain rate.
TEST(ClusterTest, ColumnsFactorFollowsTheMeasuredSweep) {
  constexpr double kQ8 = 34.0 / 32;  // q8_0 bytes per element
  Cluster c;
  c.name = "two-cores";
  c.devices_per_node = 2;
  c.device = {"core", 12, 20, 0.05, {{"q8_0", 16}}, {{"q8_0", 0.06}}};
  c.device.gemv_cols_gbps = {{"q8_0", {{512, 10}, {1024, 15}, {2048, 20}, {4096, 25}}}};
  c.cpu.cores = 2;
  c.cpu.thread_read_gbps = 18;
  c.cpu.node_read_gbps = 28;
  c.cpu.node_gemv_gbps = {{"q8_0", 24}};
  c.cpu.node_gemv_cols_gbps = {{"q8_0", {{512, 12}, {2048, 36}}}};
  c.intra_link = *LinkPreset("shm");
  c.inter_link = *LinkPreset("1gbe");
  Result<Cluster> back = ParseClusterJson(ClusterToJson(c, ""), "cols");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->device.gemv_cols_gbps, c.device.gemv_cols_gbps);
  EXPECT_EQ(back->cpu.node_gemv_cols_gbps, c.cpu.node_gemv_cols_gbps);

  const DeviceRates one = back->RatesOf("q8_0", 1);
  EXPECT_DOUBLE_EQ(one.ColumnsFactor(2048, kQ8), 1);
  EXPECT_DOUBLE_EQ(one.ColumnsFactor(512, kQ8), 0.5);
  EXPECT_DOUBLE_EQ(one.ColumnsFactor(256, kQ8), 0.5);    // held below the sweep
  EXPECT_DOUBLE_EQ(one.ColumnsFactor(8192, kQ8), 1.25);  // and above it
  const double f = std::log2(1.5);                       // 768 = 512 · 1.5, 1024 = 512 · 2
  EXPECT_DOUBLE_EQ(one.ColumnsFactor(768, kQ8), (1 / 20.0) / ((1 - f) / 10 + f / 15));
  back->devices_per_node = 1;  // one rank, both cores' threads: the pool's sweep
  EXPECT_DOUBLE_EQ(back->RatesOf("q8_0", 1).ColumnsFactor(512, kQ8), 12.0 / 36);
  EXPECT_DOUBLE_EQ(back->RatesOf("f16", 1).ColumnsFactor(512, kQ8), 1);

  // With a call cost, each measured call's cost comes out of its time before the row
  // lengths compare (a 512-column matrix is a quarter of a 2048-column one's bytes),
  // and out of the rate a 2048-column matrix's bytes stream at.
  back->devices_per_node = 2;
  back->device.gemv_call_us = {{"q8_0", 10}};
  const DeviceRates called = back->RatesOf("q8_0", 1);
  EXPECT_DOUBLE_EQ(called.call_seconds, 10e-6);
  const double b512 = 2048 * 512 * kQ8, b2048 = 2048 * 2048 * kQ8;
  const double spb512 = (b512 / 10e9 - 10e-6) / b512, spb2048 = (b2048 / 20e9 - 10e-6) / b2048;
  EXPECT_DOUBLE_EQ(called.ColumnsFactor(512, kQ8), spb2048 / spb512);
  EXPECT_DOUBLE_EQ(called.SecondsPerWeightByte(16, 2048, kQ8), (b2048 / 16e9 - 10e-6) / b2048);
  EXPECT_DOUBLE_EQ(called.SecondsPerWeightByte(16, 512, kQ8),
                   (b2048 / 16e9 - 10e-6) / b2048 * spb512 / spb2048);
  Result<Cluster> again = ParseClusterJson(ClusterToJson(*back, ""), "call");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->device.gemv_call_us, back->device.gemv_call_us);

  Result<Cluster> bad = ParseClusterJson(
      R"({"device": {"memory_gb": 1, "memory_bandwidth_gbps": 1, "tflops": 1,
                     "gemv_cols_gbps": {"q8_0": {"0": 2}}}})",
      "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("column count '0' must be an integer >= 1"),
            std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace tessera::plan
