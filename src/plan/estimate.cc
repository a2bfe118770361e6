#include "plan/estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "plan/shard.h"
#include "plan/units.h"

namespace tessera::plan {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

std::string Num(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", value);
  return buf;
}

int64_t ActBytes(const Workload& w) { return w.act_dtype.block_bytes / w.act_dtype.block_elems; }

// Probability that an expert receives at least one of `tokens` tokens' top-k picks
// under uniform routing: 1 - (1 - k/E)^tokens.
double ExpertTouched(const ModelShape& m, double tokens) {
  const double miss = 1.0 - static_cast<double>(m.num_experts_used) / m.num_experts;
  return 1.0 - std::pow(miss, tokens);
}

int64_t AttentionWeightBytes(const ModelShape& m, const DType& wdt, const Parallelism& p) {
  const int64_t q_o = 2 * m.dim * m.head_dim * HeadsPerRank(m, p);
  const int64_t k_v = 2 * m.dim * m.head_dim * KvHeadsPerRank(m, p);
  return wdt.BytesOf(q_o) + wdt.BytesOf(k_v);
}

int64_t ExpertBytesOnRank(const ModelShape& m, const DType& wdt, const Parallelism& p) {
  return p.ep > 1 ? wdt.BytesOf(3 * m.dim * m.expert_ffn_dim)
                  : wdt.BytesOf(3 * m.dim * m.expert_ffn_dim / p.tp);
}

int64_t SharedBytesOnRank(const ModelShape& m, const DType& wdt, const Parallelism& p) {
  if (m.num_shared_experts == 0) return 0;
  const int64_t params = m.num_shared_experts * 3 * m.dim * m.shared_expert_ffn_dim;
  return wdt.BytesOf(p.ep > 1 ? params : params / p.tp);
}

// Widest FFN intermediate one rank materialises.
int64_t FfnWidthOnRank(const ModelShape& m, const Parallelism& p) {
  int64_t width = (!m.is_moe() || m.num_dense_layers > 0) ? m.ffn_dim / p.tp : 0;
  if (m.is_moe()) {
    width = std::max(width, p.ep > 1 ? m.expert_ffn_dim : m.expert_ffn_dim / p.tp);
    if (m.num_shared_experts > 0) {
      width = std::max(width, p.ep > 1 ? m.shared_expert_ffn_dim : m.shared_expert_ffn_dim / p.tp);
    }
  }
  return width;
}

// Collective time of one stage's representative rank (tp/ep/cp groups).
double StageCollectiveSeconds(const ModelShape& m, const Cluster& cluster, const Workload& w,
                              const Parallelism& p, const Pass& pass, int64_t stage,
                              const Placement& placement, double* p2p_seconds) {
  double seconds = 0;
  const int64_t rank = RankOf(p, {0, 0, 0, stage});
  for (const CommCall& call : RankCalls(m, cluster, w, p, pass, rank, placement)) {
    if (call.group == "pp") {
      if (call.what == "activations" && stage < p.pp - 1) {
        *p2p_seconds = std::max(*p2p_seconds, call.seconds_per_call);
      }
      continue;
    }
    seconds += call.calls * call.seconds_per_call;
  }
  return seconds;
}

struct PassResult {
  PassTime time;
  double total_stage_seconds = 0;  // sum over stages (the latency of one pass)
};

PassResult TimePass(const ModelShape& m, const Cluster& cluster, const Workload& w,
                    const Parallelism& p, const Pass& pass, const Placement& placement,
                    int64_t busy_devices) {
  PassResult result;
  PassTime& t = result.time;
  t.pass = pass;
  double max_stage = 0;
  for (int64_t stage = 0; stage < p.pp; ++stage) {
    const StageWork work = StageCompute(m, cluster, w, p, pass, stage, busy_devices);
    const double comm =
        StageCollectiveSeconds(m, cluster, w, p, pass, stage, placement, &t.p2p_seconds);
    const double stage_seconds = work.seconds + comm;
    result.total_stage_seconds += stage_seconds;
    if (stage_seconds >= max_stage) {
      max_stage = stage_seconds;
      t.compute_seconds = work.seconds;
      t.comm_seconds = comm;
      t.flops = work.flops;
      t.bytes = work.bytes;
      t.memory_bound = work.memory_bound;
    }
  }
  t.occupancy_seconds = max_stage;
  t.comm = PassCommItems(m, cluster, w, p, pass, placement);
  return result;
}

}  // namespace

int64_t BusyDevicesPerNode(const Cluster& cluster, const Parallelism& p,
                           int64_t concurrent_stages) {
  const int64_t per_stage = p.tp * p.cp * p.dp;
  const int64_t stages = std::clamp<int64_t>(concurrent_stages, 1, p.pp);
  return std::clamp<int64_t>(per_stage * stages, 1, cluster.devices_per_node);
}

int64_t StageWeightBytes(const ModelShape& m, const DType& wdt, const Parallelism& p,
                         int64_t stage) {
  const LayerRange layers = StageLayers(m.num_layers, p.pp, stage);
  int64_t bytes = 0;
  for (int64_t l = layers.first; l < layers.end; ++l) {
    bytes += AttentionWeightBytes(m, wdt, p) + 2 * m.dim * 4;  // + f32 norms
    if (m.IsMoeLayer(l)) {
      const int64_t experts_on_rank = p.ep > 1 ? m.num_experts / p.ep : m.num_experts;
      bytes += wdt.BytesOf(m.dim * m.num_experts) + SharedBytesOnRank(m, wdt, p) +
               experts_on_rank * ExpertBytesOnRank(m, wdt, p);
    } else {
      bytes += wdt.BytesOf(3 * m.dim * m.ffn_dim / p.tp);
    }
  }
  const int64_t vocab_rows = VocabRowsOfRank(m, p, 0);
  if (stage == 0) bytes += wdt.BytesOf(vocab_rows * m.dim);
  if (stage == p.pp - 1) {
    // A tied head shares the embedding's matrix unless it sits on another stage.
    if (!m.tied_output || p.pp > 1) bytes += wdt.BytesOf(vocab_rows * m.dim);
    bytes += m.dim * 4;
  }
  return bytes;
}

Result<MemoryPerDevice> DeviceMemory(const ModelShape& m, const Cluster& cluster, const Workload& w,
                                     const Parallelism& p) {
  MemoryPerDevice mem;
  int64_t max_layers = 0;
  for (int64_t stage = 0; stage < p.pp; ++stage) {
    mem.weight_bytes = std::max(mem.weight_bytes, StageWeightBytes(m, w.weight_dtype, p, stage));
    max_layers = std::max(max_layers, StageLayers(m.num_layers, p.pp, stage).size());
  }
  // Working buffers of the largest pass: residual + normed input (2H), q/k/v
  // ((heads + 2 kv_heads)·head_dim), two FFN intermediates, at the activation dtype;
  // plus the gathered f32 logits of the decode batch.
  const int64_t prefill_tokens = TokensOnCpRank(1, w.prompt_tokens, true, p, 0);
  const int64_t batch = std::clamp<int64_t>((w.concurrency + p.dp - 1) / p.dp, 1,
                                            std::max<int64_t>(1, w.max_batch_seqs));
  const int64_t tokens = std::max(prefill_tokens, batch);
  const int64_t per_token = 2 * m.dim +
                            (HeadsPerRank(m, p) + 2 * KvHeadsPerRank(m, p)) * m.head_dim +
                            2 * FfnWidthOnRank(m, p);
  mem.activation_bytes = tokens * per_token * ActBytes(w) + batch * m.vocab_size * 4;
  const double memory_gb = cluster.RatesOf(w.weight_dtype.name, 1).memory_gb;
  mem.usable_bytes = static_cast<int64_t>(memory_gb * 1e9 * w.memory_utilization);
  const int64_t free_bytes = mem.usable_bytes - mem.weight_bytes - mem.activation_bytes;
  if (free_bytes <= 0) {
    return ResourceExhaustedError(p.ToString() + " does not fit: weights " +
                                  FormatBytes(mem.weight_bytes) + " + activations " +
                                  FormatBytes(mem.activation_bytes) + " per device exceed the " +
                                  FormatBytes(mem.usable_bytes) + " usable (" + Num(memory_gb) +
                                  " GB x " + Num(w.memory_utilization) + ")");
  }
  mem.kv_bytes_per_token = w.kv_dtype.BytesOf(max_layers * KvElemsPerTokenLayerPerRank(m, p));
  mem.kv_capacity_tokens = free_bytes / mem.kv_bytes_per_token;
  const int64_t seq_tokens = w.prompt_tokens + w.output_tokens;
  // A device holds 1/cp of each sequence's tokens.
  mem.max_seqs_per_replica = mem.kv_capacity_tokens * p.cp / seq_tokens;
  if (mem.max_seqs_per_replica < 1) {
    return ResourceExhaustedError(
        p.ToString() + " does not fit: after weights (" + FormatBytes(mem.weight_bytes) +
        ") the KV cache holds " + std::to_string(mem.kv_capacity_tokens) +
        " tokens per device, less than one sequence of " + std::to_string(seq_tokens) + " tokens");
  }
  return mem;
}

StageWork StageCompute(const ModelShape& m, const Cluster& cluster, const Workload& w,
                       const Parallelism& p, const Pass& pass, int64_t stage,
                       int64_t busy_devices) {
  StageWork work;
  const bool prefill = pass.phase == Phase::kPrefill;
  const LayerRange layers = StageLayers(m.num_layers, p.pp, stage);
  const DType& wdt = w.weight_dtype;
  const double t = static_cast<double>(TokensOnCpRank(pass, p, 0));
  const double heads = static_cast<double>(HeadsPerRank(m, p));
  const double kv_elems = static_cast<double>(KvElemsPerTokenLayerPerRank(m, p));
  const double kv_bytes_per_elem = w.kv_dtype.bytes_per_elem();
  // Attention context summed over this rank's query tokens.
  const double ctx_sum = prefill ? t * (pass.tokens_per_seq + 1) / 2.0
                                 : pass.num_seqs * (pass.context + 1.0) / static_cast<double>(p.cp);
  const double attn_params = 2.0 * m.dim * m.head_dim * (heads + KvHeadsPerRank(m, p));
  const double h = static_cast<double>(m.dim);
  const DeviceRates rates = cluster.RatesOf(
      wdt.name, busy_devices > 0 ? busy_devices : BusyDevicesPerNode(cluster, p, p.pp));
  // A few token rows (a decode batch): the weights stream at the kernel's measured
  // rate for that many rows when the cluster has one.
  const double rows_gbps = rates.WeightReadGbpsForRows(t);
  const double weight_gbps = rows_gbps > 0 ? rows_gbps : rates.weight_read_gbps;
  // Each matrix's bytes at that rate for its row length (a matrix of shorter rows
  // streams slower), and each matmul call's fixed cost (DeviceRates::call_seconds): a
  // model of small matrices pays it often.
  double weight_seconds = 0;
  double matmul_calls = 0;
  const auto read_weights = [&](double bytes, int64_t cols) {
    work.weight_bytes += bytes;
    weight_seconds += bytes * rates.SecondsPerWeightByte(weight_gbps, static_cast<double>(cols),
                                                         wdt.bytes_per_elem());
  };
  // Rows of q, k, v, gate, up, the router and the head are `hidden` long; o's and
  // down's are the rank's share of the heads or of the FFN (whole experts under EP).
  const int64_t o_cols = HeadsPerRank(m, p) * m.head_dim;
  const int64_t expert_cols = p.ep > 1 ? m.expert_ffn_dim : m.expert_ffn_dim / p.tp;
  const int64_t shared_cols = p.ep > 1 ? m.shared_expert_ffn_dim : m.shared_expert_ffn_dim / p.tp;
  const double o_share = static_cast<double>(HeadsPerRank(m, p)) /
                         static_cast<double>(2 * HeadsPerRank(m, p) + 2 * KvHeadsPerRank(m, p));
  for (int64_t l = layers.first; l < layers.end; ++l) {
    work.flops += 2 * t * attn_params + 4 * heads * m.head_dim * ctx_sum;
    const double attention = static_cast<double>(AttentionWeightBytes(m, wdt, p));
    read_weights(attention * (1 - o_share), m.dim);
    read_weights(attention * o_share, o_cols);
    matmul_calls += 2;  // q, k, v in one call; o
    // KV: decode reads the cached context and writes one token; prefill writes.
    work.bytes += (prefill ? t : ctx_sum + t) * kv_elems * kv_bytes_per_elem;
    if (!m.IsMoeLayer(l)) {
      work.flops += 2 * t * 3 * h * m.ffn_dim / p.tp;
      const double ffn = static_cast<double>(wdt.BytesOf(3 * m.dim * m.ffn_dim / p.tp));
      read_weights(ffn * 2 / 3, m.dim);         // gate, up (one call)
      read_weights(ffn / 3, m.ffn_dim / p.tp);  // down
      matmul_calls += 2;
      continue;
    }
    const double k = static_cast<double>(m.num_experts_used);
    const double shared =
        static_cast<double>(m.num_shared_experts) * 3 * h * m.shared_expert_ffn_dim;
    const double expert = 3 * h * m.expert_ffn_dim;
    read_weights(static_cast<double>(wdt.BytesOf(m.dim * m.num_experts)), m.dim);
    const double shared_bytes = static_cast<double>(SharedBytesOnRank(m, wdt, p));
    read_weights(shared_bytes * 2 / 3, m.dim);
    read_weights(shared_bytes / 3, shared_cols);
    matmul_calls += 1 + (m.num_shared_experts > 0 ? 2 : 0);  // router; shared gate+up, down
    double experts_touched = 0;  // experts on this rank some token picks
    if (p.ep == 1) {
      work.flops += 2 * t * (h * m.num_experts + k * expert / p.tp + shared / p.tp);
      experts_touched = m.num_experts * ExpertTouched(m, t);
    } else {
      const double rank_tokens = std::ceil(t / p.tp);  // each tp rank routes its share
      // Uniform routing: each rank's experts receive rank_tokens·k copies on average.
      work.flops += 2 * rank_tokens * (h * m.num_experts + k * expert + shared);
      experts_touched =
          static_cast<double>(m.num_experts) / p.ep * ExpertTouched(m, rank_tokens * p.ep);
    }
    const double experts_read = experts_touched * ExpertBytesOnRank(m, wdt, p);
    read_weights(experts_read * 2 / 3, m.dim);
    read_weights(experts_read / 3, expert_cols);
    matmul_calls += 2 * experts_touched;  // gate+up, down
  }
  if (stage == p.pp - 1) {
    const double rows = static_cast<double>(pass.rows());  // one position per sequence
    const double vocab_rows = static_cast<double>(VocabRowsOfRank(m, p, 0));
    work.flops += 2 * rows * h * vocab_rows;
    read_weights(static_cast<double>(wdt.BytesOf(VocabRowsOfRank(m, p, 0) * m.dim)), m.dim);
    matmul_calls += 1;
  }
  work.bytes += work.weight_bytes;
  const double compute_s = work.flops / (rates.matmul_tflops * 1e12);
  const double memory_s = weight_seconds + matmul_calls * rates.call_seconds +
                          (work.bytes - work.weight_bytes) / (rates.memory_gbps * 1e9);
  work.memory_bound = memory_s >= compute_s;
  work.seconds = std::max(compute_s, memory_s);
  return work;
}

namespace {

Result<Estimate> EstimateAtConcurrency(const ModelShape& m, const Cluster& cluster,
                                       const Workload& w, const Layout& layout,
                                       double concurrency) {
  Estimate e;
  e.layout = layout;
  e.concurrency = concurrency;
  const Parallelism& dec = layout.decode;
  const Parallelism& pre = layout.prefill ? *layout.prefill : layout.decode;
  if (w.prompt_tokens < pre.cp) {
    return InvalidArgumentError("cp (" + S(pre.cp) + ") exceeds the prompt tokens (" +
                                S(w.prompt_tokens) + ")");
  }
  const Placement pre_place{0};
  const Placement dec_place{layout.prefill ? layout.prefill->devices() : 0};

  Workload wd = w;
  wd.concurrency = static_cast<int64_t>(std::ceil(concurrency));
  TESSERA_ASSIGN_OR_RETURN(e.memory, DeviceMemory(m, cluster, wd, dec));
  if (layout.prefill) {
    Workload wp = w;
    wp.concurrency = pre.dp;  // one prompt per prefill replica at a time
    Result<MemoryPerDevice> pm = DeviceMemory(m, cluster, wp, pre);
    if (!pm.ok()) return pm.status().WithContext("prefill instances");
    e.prefill_memory = *pm;
  }

  // Prefill of one prompt.
  const Pass prompt{Phase::kPrefill, 1, w.prompt_tokens, 0};
  // One prompt: one stage computes at a time.
  PassResult pr =
      TimePass(m, cluster, w, pre, prompt, pre_place, BusyDevicesPerNode(cluster, pre, 1));
  e.prefill = pr.time;
  e.prefill.seconds = pr.total_stage_seconds + (pre.pp - 1) * pr.time.p2p_seconds;

  // Decode: the replica's batch cut into micro-batches so the stages overlap.
  int64_t batch = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(concurrency / dec.dp)));
  if (batch > w.max_batch_seqs) {
    batch = std::max<int64_t>(1, w.max_batch_seqs);
    e.batch_capped = true;
  }
  if (batch > e.memory.max_seqs_per_replica) {
    batch = e.memory.max_seqs_per_replica;
    e.kv_limited = true;
  }
  e.seqs_per_replica = batch;
  const int64_t micro = std::min(batch, dec.pp);
  const int64_t per_micro = (batch + micro - 1) / micro;
  const Pass step{Phase::kDecode, per_micro, 1, w.prompt_tokens + w.output_tokens / 2};
  // Stages busy at once: as many as there are micro-batches to keep them busy.
  PassResult dr =
      TimePass(m, cluster, w, dec, step, dec_place, BusyDevicesPerNode(cluster, dec, micro));
  e.decode = dr.time;
  e.decode.micro_batches = micro;
  // A micro-batch's token comes back to stage 0 (the driver's step message) before its
  // next step starts: one round trip = every stage once + pp hops. With m micro-batches
  // in flight the busiest stage must also serve all m per round: TPOT = max(round trip,
  // m × (busiest stage + its send)).
  e.decode.round_trip_seconds = dr.total_stage_seconds + dec.pp * dr.time.p2p_seconds;
  e.decode.seconds = dec.pp == 1 ? dr.time.occupancy_seconds
                                 : std::max(e.decode.round_trip_seconds,
                                            static_cast<double>(micro) *
                                                (dr.time.occupancy_seconds + dr.time.p2p_seconds));
  // The busiest stage's idle share of a step.
  e.decode.bubble_fraction =
      dec.pp == 1 ? 0.0
                  : 1.0 - static_cast<double>(micro) *
                              (dr.time.occupancy_seconds + dr.time.p2p_seconds) / e.decode.seconds;
  {
    // Busiest rank's sent bytes per decode step (all its micro-batches).
    int64_t busiest = 0;
    for (int64_t rank = 0; rank < dec.devices(); ++rank) {
      int64_t sent = 0;
      for (const CommCall& c : RankCalls(m, cluster, w, dec, step, rank, dec_place)) {
        sent += c.bytes_per_call.sent * c.calls;
      }
      busiest = std::max(busiest, sent);
    }
    e.decode_bytes_per_step = busiest * micro;
  }

  const double out = static_cast<double>(w.output_tokens);
  // Sequences decoding at once: ⌈C/dp⌉ per replica, but never more than asked for.
  const double in_flight = std::min(concurrency, static_cast<double>(dec.dp * batch));
  if (layout.prefill) {
    // Prefill instances take the first devices, decode instances the rest: the
    // transfer crosses nodes when the first decode device is on another node.
    const bool crosses = dec_place.first_device / cluster.devices_per_node != 0;
    CommItem kv = KvTransferItem(m, w, pre, crosses);
    const Link& link = kv.crosses_nodes ? cluster.inter_link : cluster.intra_link;
    e.kv_transfer_seconds = SendRecvSeconds(static_cast<double>(kv.max_rank.sent), link);
    e.kv_transfer = kv;
    e.ttft_seconds = e.prefill.seconds + e.kv_transfer_seconds;
    e.tpot_seconds = e.decode.seconds;
    const double decode_rate = in_flight / e.tpot_seconds;
    const double prefill_rate = pre.dp / e.prefill.occupancy_seconds * out;
    e.throughput_tokens_per_s = std::min(decode_rate, prefill_rate);
  } else {
    e.ttft_seconds = e.prefill.seconds;
    // The other sequences' prefills are interleaved with the batch's decode steps:
    // over one sequence's `output` steps the other batch-1 slots each start a new
    // sequence, whose prefill stalls the step it joins.
    e.prefill_stall_seconds = (batch - 1) * e.prefill.occupancy_seconds / out;
    e.tpot_seconds = e.decode.seconds + e.prefill_stall_seconds;
    // Each slot produces `output` tokens per cycle of its own prefill + decode.
    e.throughput_tokens_per_s = in_flight * out / (e.ttft_seconds + out * e.tpot_seconds);
  }
  e.e2e_seconds = e.ttft_seconds + (out - 1) * e.tpot_seconds;
  return e;
}

}  // namespace

Result<Estimate> EstimateLayout(const ModelShape& m, const Cluster& cluster, const Workload& w,
                                const Layout& layout) {
  TESSERA_RETURN_IF_ERROR(ValidateModelShape(m));
  TESSERA_RETURN_IF_ERROR(ValidateCluster(cluster));
  TESSERA_RETURN_IF_ERROR(ValidateLayout(m, cluster, w.weight_dtype, layout));
  if (w.prompt_tokens < 1 || w.output_tokens < 1) {
    return InvalidArgumentError("prompt and output lengths must be at least 1 token");
  }
  if (w.request_rate <= 0) {
    if (w.concurrency < 1) return InvalidArgumentError("concurrency must be at least 1");
    return EstimateAtConcurrency(m, cluster, w, layout, static_cast<double>(w.concurrency));
  }
  // Little's law: in flight = rate × end-to-end latency, iterated to a fixed point.
  double concurrency = 1;
  TESSERA_ASSIGN_OR_RETURN(Estimate e, EstimateAtConcurrency(m, cluster, w, layout, concurrency));
  // It diverges when the layout cannot keep up: the batch hits its cap (KV cache or
  // max_batch_seqs) while the queue still grows.
  bool converged = false;
  for (int i = 0; i < 100 && !converged; ++i) {
    const double next = std::max(1.0, w.request_rate * e.e2e_seconds);
    if (std::fabs(next - concurrency) < 0.5) {
      converged = true;
      break;
    }
    if ((e.kv_limited || e.batch_capped) && next > concurrency) break;
    concurrency = next;
    TESSERA_ASSIGN_OR_RETURN(e, EstimateAtConcurrency(m, cluster, w, layout, concurrency));
  }
  e.overloaded = !converged;
  return e;
}

std::vector<SweepPoint> SweepConcurrency(const ModelShape& m, const Cluster& cluster,
                                         const Workload& w, const Layout& layout,
                                         int64_t max_concurrency) {
  std::vector<SweepPoint> points;
  Workload at = w;
  at.request_rate = 0;
  for (int64_t c = 1; c <= max_concurrency; c *= 2) {
    at.concurrency = c;
    Result<Estimate> e = EstimateLayout(m, cluster, at, layout);
    if (!e.ok()) break;
    points.push_back({c, e->tpot_seconds, e->throughput_tokens_per_s});
    if (e->kv_limited || e->batch_capped) break;
  }
  return points;
}

}  // namespace tessera::plan
