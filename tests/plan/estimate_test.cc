#include "plan/estimate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

Workload Bf16Workload() {
  Workload w;
  w.weight_dtype = *ParseDType("bf16");
  w.kv_dtype = *ParseDType("f16");
  w.act_dtype = *ParseDType("bf16");
  return w;
}

TEST(MemoryTest, Llama70bShardsByHand) {
  const ModelShape m = *ModelPreset("llama-3-70b");
  const Cluster c = *ClusterPreset("8xh100");
  const Workload w = Bf16Workload();
  // tp=8: per layer q,o 2·8192·128·8, k,v 2·8192·128·1, FFN 3·8192·28672/8, bf16,
  // plus two f32 norms; the vocab shard 128256/8 = 16032 rows for the embedding
  // and the head; the f32 final norm.
  const int64_t per_layer =
      2 * (2 * 8192 * 128 * 8 + 2 * 8192 * 128 + 3 * 8192 * 28672 / 8) + 2 * 8192 * 4;
  const int64_t expected = 80 * per_layer + 2 * 2 * 16032 * 8192 + 8192 * 4;
  EXPECT_EQ(StageWeightBytes(m, w.weight_dtype, {.tp = 8}, 0), expected);
  Result<MemoryPerDevice> mem = DeviceMemory(m, c, w, {.tp = 8});
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ(mem->weight_bytes, expected);
  // KV per token per device: 80 layers × 2 × 1 KV head × 128 × 2 B.
  EXPECT_EQ(mem->kv_bytes_per_token, 80 * 2 * 128 * 2);
  EXPECT_EQ(mem->usable_bytes, static_cast<int64_t>(80e9 * 0.9));
  EXPECT_EQ(
      mem->kv_capacity_tokens,
      (mem->usable_bytes - mem->weight_bytes - mem->activation_bytes) / mem->kv_bytes_per_token);
  // One H100 cannot hold 141 GB of weights.
  Result<MemoryPerDevice> one = DeviceMemory(m, c, w, {});
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(one.status().message().find("does not fit"), std::string::npos);
}

TEST(MemoryTest, PipelineStagesHoldTheirLayersAndEnds) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const DType bf16 = *ParseDType("bf16");
  const int64_t s0 = StageWeightBytes(m, bf16, {.pp = 2}, 0);
  const int64_t s1 = StageWeightBytes(m, bf16, {.pp = 2}, 1);
  const int64_t whole = StageWeightBytes(m, bf16, {}, 0);
  EXPECT_EQ(s0 + s1, whole);  // untied: embedding on stage 0, head on stage 1
  // A tied model keeps a copy of the matrix on each end stage once split.
  const ModelShape tied = *ModelPreset("synth-110m");
  const DType f32 = *ParseDType("f32");
  EXPECT_EQ(StageWeightBytes(tied, f32, {.pp = 2}, 0) + StageWeightBytes(tied, f32, {.pp = 2}, 1),
            StageWeightBytes(tied, f32, {}, 0) + 32000 * 768 * 4);
}

TEST(EstimateTest, DecodeIsMemoryBoundRoofline) {
  // One sequence of a dense model on one device: the step reads every weight once
  // (plus the small KV cache), far below the FLOP roof.
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("8xh100");
  Workload w = Bf16Workload();
  w.prompt_tokens = 100;
  w.output_tokens = 20;
  const StageWork work = StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 110}, 0);
  EXPECT_TRUE(work.memory_bound);
  const double weights = static_cast<double>(StageWeightBytes(m, w.weight_dtype, {}, 0));
  const double kv = (111 + 1) * 32 * 2 * 8 * 128 * 2.0;  // read context + write one
  const double embedding_and_norms = 128256.0 * 4096 * 2 + 32 * 2 * 4096 * 4 + 4096 * 4;
  EXPECT_NEAR(work.bytes, weights - embedding_and_norms + kv, 1);
  EXPECT_NEAR(work.seconds, work.bytes / 3350e9, 1e-12);
  // FLOPs: 2 per active weight (the head included) + attention over 111 positions.
  EXPECT_NEAR(
      work.flops,
      2.0 * (CountParams(m).ActivePerToken(m) - 32 * 2 * 4096 - 4096) + 32 * 4.0 * 32 * 128 * 111,
      1);
}

TEST(EstimateTest, MeasuredKernelRatesBoundTheWeights) {
  // A calibrated device whose q8_0 GEMV streams weights at 10 GB/s of its 40:
  // the weights take bytes / 10 GB/s, the KV cache bytes / 40 GB/s.
  const ModelShape m = *ModelPreset("tinyllama-1.1b");
  Cluster c = *ClusterPreset("4xdesktop-1gbe");
  c.device.gemv_gbps = {{"q8_0", 10}};
  Workload w;
  w.weight_dtype = *ParseDType("q8_0");
  const StageWork work = StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0);
  EXPECT_TRUE(work.memory_bound);
  EXPECT_NEAR(work.seconds, work.weight_bytes / 10e9 + (work.bytes - work.weight_bytes) / 40e9,
              1e-12);
  c.device.gemv_gbps.clear();
  EXPECT_NEAR(StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0).seconds, work.bytes / 40e9,
              1e-12);
}

TEST(EstimateTest, FewRowsStreamAtTheirMeasuredRate) {
  // A calibrated one-core node whose q8_0 kernel streams 16 GB/s for one row and
  // 8 GB/s for four: a 4-sequence decode step reads its weights at 8 GB/s, twice
  // the one-sequence step's weight time; 64 rows are past the measured counts and
  // fall back to the roofline.
  const ModelShape m = *ModelPreset("tinyllama-1.1b");
  Cluster c = *ClusterPreset("4xdesktop-1gbe");
  c.nodes = 1;
  c.devices_per_node = 1;
  c.device.gemv_gbps = {{"q8_0", 16}};
  c.device.rows_gemv_gbps = {{"q8_0", {{4, 8}, {16, 2}}}};
  c.cpu.cores = 1;
  c.cpu.thread_read_gbps = 30;
  c.cpu.node_read_gbps = 30;
  Workload w;
  w.weight_dtype = *ParseDType("q8_0");
  const StageWork one = StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0);
  const StageWork four = StageCompute(m, c, w, {}, {Phase::kDecode, 4, 1, 100}, 0);
  EXPECT_NEAR(one.seconds, one.weight_bytes / 16e9 + (one.bytes - one.weight_bytes) / 30e9, 1e-12);
  EXPECT_NEAR(four.seconds, four.weight_bytes / 8e9 + (four.bytes - four.weight_bytes) / 30e9,
              1e-12);
  const StageWork many = StageCompute(m, c, w, {}, {Phase::kDecode, 64, 1, 100}, 0);
  EXPECT_NEAR(many.seconds,
              std::max(many.flops / (c.device.MatMulTflops("q8_0") * 1e12),
                       many.weight_bytes / 16e9 + (many.bytes - many.weight_bytes) / 30e9),
              1e-12);
}

TEST(EstimateTest, ShortRowsStreamAtTheirMeasuredRate) {
  // A calibrated one-core node whose q8_0 GEMV streams 16 GB/s over 2048-column
  // matrices and half that over 768-column ones: the 110M shape's matrices are all
  // 768 wide but ffn_down (2048), so they take twice their plain time, ffn_down its
  // plain time. Under tp=2 ffn_down's rows are 1024 long (between the two), and the
  // head and o's rows stay 768 and 384 (held at the sweep's shortest).
  const ModelShape m = *ModelPreset("synth-110m");
  Cluster c = *ClusterPreset("4xdesktop-1gbe");
  c.nodes = 1;
  c.devices_per_node = 2;
  c.device.gemv_gbps = {{"q8_0", 16}};
  c.device.gemv_cols_gbps = {{"q8_0", {{768, 8}, {2048, 16}}}};
  c.cpu.cores = 2;
  c.cpu.thread_read_gbps = 30;
  c.cpu.node_read_gbps = 60;
  c.cpu.node_gemv_gbps = {{"q8_0", 32}};
  Workload w;
  w.weight_dtype = *ParseDType("q8_0");
  const StageWork one = StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0, 1);
  const double down = static_cast<double>(m.num_layers * w.weight_dtype.BytesOf(768 * 2048));
  const double kv = one.bytes - one.weight_bytes;
  EXPECT_NEAR(one.seconds, (one.weight_bytes - down) / 8e9 + down / 16e9 + kv / 30e9, 1e-12);
  c.device.gemv_cols_gbps.clear();
  EXPECT_NEAR(StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0, 1).seconds,
              one.weight_bytes / 16e9 + kv / 30e9, 1e-12);
  // A call cost of 10 us: 4 matmul calls a layer (q/k/v, o, gate/up, down) and the
  // head's, each 10 us, and the bytes at the rate left once the measured 2048 x 2048
  // matrices' own call costs are taken out.
  c.device.gemv_call_us = {{"q8_0", 10}};
  const double matrix = 2048.0 * 2048 * 34 / 32;
  EXPECT_NEAR(
      StageCompute(m, c, w, {}, {Phase::kDecode, 1, 1, 100}, 0, 1).seconds,
      (12 * 4 + 1) * 10e-6 + one.weight_bytes * (matrix / 16e9 - 10e-6) / matrix + kv / 30e9,
      1e-12);
  c.device.gemv_call_us.clear();
  c.device.gemv_cols_gbps = {{"q8_0", {{768, 8}, {2048, 16}}}};
  const StageWork tp2 = StageCompute(m, c, w, {.tp = 2}, {Phase::kDecode, 1, 1, 100}, 0, 2);
  const double f1024 = std::log2(1024.0 / 768) / std::log2(2048.0 / 768);
  const double down_tp2 = down / 2;
  // Two ranks busy: each streams at min(16, 32 / 2) = 16 GB/s at 2048 columns.
  EXPECT_NEAR(tp2.seconds,
              (tp2.weight_bytes - down_tp2) / 8e9 +
                  down_tp2 * ((1 - f1024) / 8 + f1024 / 16) / 1e9 +
                  (tp2.bytes - tp2.weight_bytes) / 30e9,
              1e-9);
}

TEST(EstimateTest, PipelineBubbleNeedsEnoughSequences) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("8xh100");
  Workload w = Bf16Workload();
  w.concurrency = 1;
  Result<Estimate> one = EstimateLayout(m, c, w, {{.pp = 4}, std::nullopt});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  // One sequence: the busiest stage works one visit of a round trip through 4 stages
  // — more than a quarter, because the last stage also runs the 128k-row head
  // (8 layers + head against 8 layers: about 0.3 of the round trip, idle 0.7).
  EXPECT_GT(one->decode.bubble_fraction, 0.65);
  EXPECT_LT(one->decode.bubble_fraction, 0.75);
  w.concurrency = 8;
  Result<Estimate> eight = EstimateLayout(m, c, w, {{.pp = 4}, std::nullopt});
  ASSERT_TRUE(eight.ok());
  EXPECT_EQ(eight->decode.micro_batches, 4);
  EXPECT_EQ(eight->decode.pass.num_seqs, 2);
  EXPECT_DOUBLE_EQ(eight->decode.bubble_fraction, 0);
  // TTFT: a prompt crosses every stage once.
  EXPECT_GT(one->ttft_seconds, 0);
  EXPECT_NEAR(one->e2e_seconds, one->ttft_seconds + (w.output_tokens - 1) * one->tpot_seconds,
              1e-12);
}

TEST(EstimateTest, DataParallelScalesThroughputNotLatency) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("8xh100");
  Workload w = Bf16Workload();
  w.concurrency = 8;
  const Estimate dp1 = *EstimateLayout(m, c, w, {{}, std::nullopt});
  const Estimate dp8 = *EstimateLayout(m, c, w, {{.dp = 8}, std::nullopt});
  EXPECT_EQ(dp8.seqs_per_replica, 1);
  EXPECT_EQ(dp8.decode_bytes_per_step, 0);
  EXPECT_LT(dp8.tpot_seconds, dp1.tpot_seconds);
  EXPECT_NEAR(dp8.ttft_seconds, dp1.ttft_seconds, 1e-12);
}

TEST(EstimateTest, PrefillDecodeSplitAddsTheKvTransfer) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("2x8xh100-ib");
  Workload w = Bf16Workload();
  w.prompt_tokens = 4096;
  Result<Estimate> e = EstimateLayout(m, c, w, {{.dp = 8}, Parallelism{.tp = 8}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(e->kv_transfer.has_value());
  EXPECT_EQ(e->kv_transfer->total_sent, int64_t{512} << 20);
  EXPECT_TRUE(e->kv_transfer->crosses_nodes);  // decode devices start on node 1
  // 512 MiB from 8 senders over InfiniBand (50 GB/s, 3 us).
  EXPECT_NEAR(e->kv_transfer_seconds, 3e-6 + (64 << 20) / 50e9, 1e-9);
  EXPECT_NEAR(e->ttft_seconds, e->prefill.seconds + e->kv_transfer_seconds, 1e-12);
  EXPECT_EQ(e->prefill_stall_seconds, 0);
}

TEST(EstimateTest, RequestRateFindsItsConcurrency) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("8xh100");
  Workload w = Bf16Workload();
  w.request_rate = 4;
  const Estimate e = *EstimateLayout(m, c, w, {{.tp = 2}, std::nullopt});
  EXPECT_FALSE(e.overloaded);
  EXPECT_NEAR(e.concurrency, w.request_rate * e.e2e_seconds, 1.0);
  w.request_rate = 1e6;  // far beyond one replica
  EXPECT_TRUE(EstimateLayout(m, c, w, {{.tp = 2}, std::nullopt})->overloaded);
}

TEST(EstimateTest, BadInputIsRefusedWithTheReason) {
  const ModelShape m = *ModelPreset("llama-3-8b");
  const Cluster c = *ClusterPreset("8xh100");
  Workload w = Bf16Workload();
  Result<Estimate> e = EstimateLayout(m, c, w, {{.tp = 3}, std::nullopt});
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  w.prompt_tokens = 2;
  e = EstimateLayout(m, c, w, {{.cp = 4}, std::nullopt});
  EXPECT_NE(e.status().message().find("cp (4) exceeds the prompt tokens (2)"), std::string::npos);
  Cluster bad = c;
  bad.device.memory_bandwidth_gbps = 0;
  EXPECT_EQ(EstimateLayout(m, bad, Bf16Workload(), {{}, std::nullopt}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

TEST(SweepTest, ThroughputGrowsWithConcurrencyUntilTheCap) {
  Workload w;
  w.weight_dtype = *ParseDType("bf16");
  w.max_batch_seqs = 16;
  const std::vector<SweepPoint> points = SweepConcurrency(
      *ModelPreset("llama-3-8b"), *ClusterPreset("8xh100"), w, {{.tp = 2}, std::nullopt}, 1024);
  ASSERT_EQ(points.size(), 6u);  // 1, 2, 4, 8, 16, then 32 hits the batch cap
  EXPECT_EQ(points.back().concurrency, 32);
  for (size_t i = 1; i < points.size() - 1; ++i) {
    EXPECT_GT(points[i].throughput_tokens_per_s, points[i - 1].throughput_tokens_per_s);
    EXPECT_GE(points[i].tpot_seconds, points[i - 1].tpot_seconds);
  }
}

}  // namespace
}  // namespace tessera::plan
