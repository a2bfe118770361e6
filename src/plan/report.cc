#include "plan/report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "plan/units.h"

namespace tessera::plan {
namespace {

using nlohmann::json;

std::string Printf(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return buf;
}

std::string Ms(double seconds) { return Printf("%.3g", seconds * 1e3); }

std::string ModelLine(const ReportContext& ctx) {
  const ParamCounts params = CountParams(ctx.model);
  const double total = static_cast<double>(params.Total(ctx.model));
  const double active = static_cast<double>(params.ActivePerToken(ctx.model));
  std::string line =
      "model    " + ctx.model.name + ": " + Printf("%.3g", total / 1e9) + " B params";
  if (ctx.model.is_moe()) line += Printf(" (%.3g B active per token)", active / 1e9);
  line += ", " + std::to_string(ctx.model.num_layers) + " layers, hidden " +
          std::to_string(ctx.model.dim) + ", " + std::to_string(ctx.model.num_heads) + " heads / " +
          std::to_string(ctx.model.num_kv_heads) + " kv heads x " +
          std::to_string(ctx.model.head_dim);
  if (ctx.model.is_moe()) {
    line += ", " + std::to_string(ctx.model.num_experts) + " experts top-" +
            std::to_string(ctx.model.num_experts_used);
  }
  line +=
      "; " + ctx.workload.weight_dtype.name + " weights " +
      FormatBytes(static_cast<double>(ctx.workload.weight_dtype.BytesOf(params.Total(ctx.model))));
  return line;
}

std::string ClusterLine(const Cluster& c) {
  std::string line = "cluster  " + c.name + ": " + std::to_string(c.nodes) + " node(s) x " +
                     std::to_string(c.devices_per_node) + " " + c.device.name +
                     Printf(" (%.3g GB, %.4g GB/s, %.4g TFLOP/s)", c.device.memory_gb,
                            c.device.memory_bandwidth_gbps, c.device.tflops);
  if (c.devices_per_node > 1) {
    line += Printf("; intra %s %.4g GB/s %.3g us", c.intra_link.name.c_str(),
                   c.intra_link.bandwidth_gbps, c.intra_link.latency_us);
  }
  if (c.nodes > 1) {
    line += Printf("; inter %s %.4g GB/s %.3g us", c.inter_link.name.c_str(),
                   c.inter_link.bandwidth_gbps, c.inter_link.latency_us);
  }
  return line;
}

std::string WorkloadLine(const Workload& w) {
  std::string line = "workload prompt " + std::to_string(w.prompt_tokens) + ", output " +
                     std::to_string(w.output_tokens) + " tokens, ";
  line += w.request_rate > 0 ? Printf("%.3g requests/s", w.request_rate)
                             : std::to_string(w.concurrency) + " sequences in flight";
  line += "; KV " + w.kv_dtype.name + ", activations " + w.act_dtype.name + " on the wire";
  line += "; all-reduce " + (w.allreduce_algo ? std::string(AllReduceAlgoName(*w.allreduce_algo))
                                              : std::string("auto"));
  return line;
}

json ItemJson(const CommItem& item) {
  json j = {{"group", item.group},
            {"primitive", item.primitive},
            {"algorithm", item.algorithm},
            {"what", item.what},
            {"group_size", item.group_size},
            {"calls_per_rank", item.calls_per_rank},
            {"message_bytes", item.message_bytes},
            {"max_rank_sent_bytes", item.max_rank.sent},
            {"max_rank_received_bytes", item.max_rank.received},
            {"total_sent_bytes", item.total_sent},
            {"crosses_nodes", item.crosses_nodes},
            {"expected_value", item.expected},
            {"formula", item.formula},
            {"note", item.note}};
  if (item.seed_bytes >= 0) {
    j["seed_formula"] = item.seed_formula;
    j["seed_bytes"] = item.seed_bytes;
  }
  return j;
}

json PassJson(const PassTime& t) {
  json items = json::array();
  for (const CommItem& item : t.comm) items.push_back(ItemJson(item));
  return {{"num_seqs", t.pass.num_seqs},
          {"tokens_per_seq", t.pass.tokens_per_seq},
          {"context", t.pass.context},
          {"micro_batches", t.micro_batches},
          {"seconds", t.seconds},
          {"busiest_stage_compute_seconds", t.compute_seconds},
          {"busiest_stage_comm_seconds", t.comm_seconds},
          {"p2p_seconds", t.p2p_seconds},
          {"flops", t.flops},
          {"memory_bytes", t.bytes},
          {"memory_bound", t.memory_bound},
          {"bubble_fraction", t.bubble_fraction},
          {"comm", items}};
}

json ParallelismJson(const Parallelism& p) {
  return {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"ep", p.ep}, {"cp", p.cp}};
}

json MemoryJson(const MemoryPerDevice& m) {
  return {{"weight_bytes", m.weight_bytes},
          {"activation_bytes", m.activation_bytes},
          {"usable_bytes", m.usable_bytes},
          {"kv_bytes_per_token", m.kv_bytes_per_token},
          {"kv_capacity_tokens", m.kv_capacity_tokens},
          {"max_seqs_per_replica", m.max_seqs_per_replica}};
}

void AppendItems(std::string& out, const std::vector<CommItem>& items) {
  if (items.empty()) {
    out += "    no communication (each device holds a whole replica: DP needs none)\n";
    return;
  }
  out += Printf("    %-4s %-10s %-18s %-18s %5s %11s %11s %11s\n", "grp", "primitive", "algorithm",
                "what", "calls", "message", "sent/rank", "recv/rank");
  for (const CommItem& item : items) {
    out += Printf("    %-4s %-10s %-18s %-18s %5lld %11s %11s %11s%s%s\n", item.group.c_str(),
                  item.primitive.c_str(), item.algorithm.c_str(), item.what.c_str(),
                  static_cast<long long>(item.calls_per_rank),
                  FormatBytes(static_cast<double>(item.message_bytes)).c_str(),
                  FormatBytes(static_cast<double>(item.max_rank.sent)).c_str(),
                  FormatBytes(static_cast<double>(item.max_rank.received)).c_str(),
                  item.crosses_nodes ? "  [inter-node]" : "", item.expected ? "  [expected]" : "");
  }
  for (const CommItem& item : items) {
    out += "      " + item.group + " " + item.what + ": " + item.formula + "\n";
    if (item.seed_bytes >= 0) {
      out += "        seeds: " + item.seed_formula + " = " + FormatBytes(item.seed_bytes) + "; " +
             item.note + "\n";
    } else if (!item.note.empty()) {
      out += "        " + item.note + "\n";
    }
  }
}

}  // namespace

std::string FormatTable(const ReportContext& ctx, const Plan& plan, int top) {
  std::string out =
      ModelLine(ctx) + "\n" + ClusterLine(ctx.cluster) + "\n" + WorkloadLine(ctx.workload) + "\n";
  out += "goal     " + std::string(GoalName(ctx.goal)) + "; " + std::to_string(plan.considered) +
         " layouts considered, " + std::to_string(plan.ranked.size()) + " fit\n\n";
  out += Printf("%3s  %-22s %4s %10s %10s %6s %9s %9s %10s %10s %6s\n", "#", "layout", "dev",
                "weights", "KV tok", "seqs", "TTFT ms", "TPOT ms", "tok/s", "comm/step", "bubble");
  const int rows = std::min<int>(top, static_cast<int>(plan.ranked.size()));
  for (int i = 0; i < rows; ++i) {
    const Estimate& e = plan.ranked[i];
    out += Printf("%3d  %-22s %4lld %10s %10s %6lld%s %9s %9s %10.4g %10s %5.0f%%%s\n", i + 1,
                  e.layout.ToString().c_str(), static_cast<long long>(e.layout.devices()),
                  FormatBytes(static_cast<double>(e.memory.weight_bytes)).c_str(),
                  FormatCount(static_cast<double>(e.memory.kv_capacity_tokens)).c_str(),
                  static_cast<long long>(e.seqs_per_replica),
                  e.kv_limited ? "*" : (e.batch_capped ? "+" : " "), Ms(e.ttft_seconds).c_str(),
                  Ms(e.tpot_seconds).c_str(), e.throughput_tokens_per_s,
                  FormatBytes(static_cast<double>(e.decode_bytes_per_step)).c_str(),
                  100 * e.decode.bubble_fraction, e.overloaded ? "  overloaded" : "");
  }
  out +=
      "\nweights and KV tok are per device; seqs = decode batch per replica (* limited by "
      "the KV cache, + by max_batch_seqs); comm/step = bytes the busiest rank sends per decode "
      "step\n";
  return out;
}

std::string FormatDetail(const ReportContext& ctx, const Estimate& e) {
  std::string out =
      "layout " + e.layout.ToString() + " (" + std::to_string(e.layout.devices()) + " devices)\n";
  auto memory = [&](const char* label, const MemoryPerDevice& m) {
    out += Printf(
        "  memory per device%s: weights %s, activations %s, usable %s -> KV cache %s tokens "
        "(%s per token), %lld whole sequences per replica\n",
        label, FormatBytes(static_cast<double>(m.weight_bytes)).c_str(),
        FormatBytes(static_cast<double>(m.activation_bytes)).c_str(),
        FormatBytes(static_cast<double>(m.usable_bytes)).c_str(),
        FormatCount(static_cast<double>(m.kv_capacity_tokens)).c_str(),
        FormatBytes(static_cast<double>(m.kv_bytes_per_token)).c_str(),
        static_cast<long long>(m.max_seqs_per_replica));
  };
  memory(e.prefill_memory ? " (decode)" : "", e.memory);
  if (e.prefill_memory) memory(" (prefill)", *e.prefill_memory);
  const PassTime& p = e.prefill;
  out += Printf(
      "  prefill of one %lld-token prompt: %s ms = busiest stage %s ms compute (%s, %.3g "
      "GFLOP) + %s ms collectives, %lld stage(s), boundary %s ms\n",
      static_cast<long long>(p.pass.tokens_per_seq), Ms(p.seconds).c_str(),
      Ms(p.compute_seconds).c_str(), p.memory_bound ? "memory-bound" : "compute-bound",
      p.flops / 1e9, Ms(p.comm_seconds).c_str(),
      static_cast<long long>(e.layout.prefill ? e.layout.prefill->pp : e.layout.decode.pp),
      Ms(p.p2p_seconds).c_str());
  AppendItems(out, p.comm);
  if (e.kv_transfer) {
    out += "  prefill -> decode KV transfer: " + Ms(e.kv_transfer_seconds) + " ms\n";
    AppendItems(out, {*e.kv_transfer});
  }
  const PassTime& d = e.decode;
  out += Printf(
      "  decode step of %lld sequence(s) (%lld micro-batch(es) of %lld, context %lld): TPOT %s "
      "ms = %s ms per stage visit (%s ms compute, %s, + %s ms collectives + %s ms boundary), "
      "bubble %.0f%%",
      static_cast<long long>(e.seqs_per_replica), static_cast<long long>(d.micro_batches),
      static_cast<long long>(d.pass.num_seqs), static_cast<long long>(d.pass.context),
      Ms(d.seconds).c_str(), Ms(d.occupancy_seconds).c_str(), Ms(d.compute_seconds).c_str(),
      d.memory_bound ? "memory-bound" : "compute-bound", Ms(d.comm_seconds).c_str(),
      Ms(d.p2p_seconds).c_str(), 100 * d.bubble_fraction);
  if (e.prefill_stall_seconds > 0) {
    out += " + " + Ms(e.prefill_stall_seconds) + " ms of interleaved prefills";
  }
  out += "\n";
  out += "  communication per stage visit (sent/recv/rank: busiest rank, whole pass):\n";
  AppendItems(out, d.comm);
  out += Printf("  => TTFT %s ms, TPOT %s ms, end-to-end %s ms, %.4g output tokens/s\n",
                Ms(e.ttft_seconds).c_str(), Ms(e.tpot_seconds).c_str(), Ms(e.e2e_seconds).c_str(),
                e.throughput_tokens_per_s);
  (void)ctx;
  return out;
}

std::string PlanToJson(const ReportContext& ctx, const Plan& plan, int top) {
  const ParamCounts params = CountParams(ctx.model);
  const ModelShape& m = ctx.model;
  json j;
  j["model"] = {{"name", m.name},
                {"layers", m.num_layers},
                {"hidden", m.dim},
                {"heads", m.num_heads},
                {"kv_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"ffn", m.ffn_dim},
                {"vocab", m.vocab_size},
                {"experts", m.num_experts},
                {"experts_used", m.num_experts_used},
                {"expert_ffn", m.expert_ffn_dim},
                {"params", params.Total(m)},
                {"active_params_per_token", params.ActivePerToken(m)}};
  const Cluster& c = ctx.cluster;
  j["cluster"] = {{"name", c.name},
                  {"nodes", c.nodes},
                  {"devices_per_node", c.devices_per_node},
                  {"device",
                   {{"name", c.device.name},
                    {"memory_gb", c.device.memory_gb},
                    {"memory_bandwidth_gbps", c.device.memory_bandwidth_gbps},
                    {"tflops", c.device.tflops}}},
                  {"intra_link",
                   {{"name", c.intra_link.name},
                    {"bandwidth_gbps", c.intra_link.bandwidth_gbps},
                    {"latency_us", c.intra_link.latency_us}}},
                  {"inter_link",
                   {{"name", c.inter_link.name},
                    {"bandwidth_gbps", c.inter_link.bandwidth_gbps},
                    {"latency_us", c.inter_link.latency_us}}}};
  const Workload& w = ctx.workload;
  j["workload"] = {
      {"prompt_tokens", w.prompt_tokens},    {"output_tokens", w.output_tokens},
      {"concurrency", w.concurrency},        {"request_rate", w.request_rate},
      {"weight_dtype", w.weight_dtype.name}, {"kv_dtype", w.kv_dtype.name},
      {"act_dtype", w.act_dtype.name},       {"memory_utilization", w.memory_utilization}};
  j["goal"] = std::string(GoalName(ctx.goal));
  j["considered"] = plan.considered;
  j["fitting"] = plan.ranked.size();
  j["explanation"] = plan.explanation;
  json layouts = json::array();
  const int rows = std::min<int>(top, static_cast<int>(plan.ranked.size()));
  for (int i = 0; i < rows; ++i) {
    const Estimate& e = plan.ranked[i];
    json l = {{"rank", i + 1},
              {"layout", e.layout.ToString()},
              {"devices", e.layout.devices()},
              {"decode", ParallelismJson(e.layout.decode)},
              {"memory", MemoryJson(e.memory)},
              {"seqs_per_replica", e.seqs_per_replica},
              {"kv_limited", e.kv_limited},
              {"batch_capped", e.batch_capped},
              {"overloaded", e.overloaded},
              {"concurrency", e.concurrency},
              {"prefill_pass", PassJson(e.prefill)},
              {"decode_pass", PassJson(e.decode)},
              {"prefill_stall_seconds", e.prefill_stall_seconds},
              {"ttft_seconds", e.ttft_seconds},
              {"tpot_seconds", e.tpot_seconds},
              {"e2e_seconds", e.e2e_seconds},
              {"throughput_tokens_per_s", e.throughput_tokens_per_s},
              {"decode_bytes_per_step", e.decode_bytes_per_step}};
    if (e.layout.prefill) {
      l["prefill"] = ParallelismJson(*e.layout.prefill);
      l["prefill_memory"] = MemoryJson(*e.prefill_memory);
    }
    if (e.kv_transfer) {
      l["kv_transfer"] = ItemJson(*e.kv_transfer);
      l["kv_transfer_seconds"] = e.kv_transfer_seconds;
    }
    layouts.push_back(l);
  }
  j["layouts"] = layouts;
  return j.dump(2) + "\n";
}

std::string PlotScript(const ReportContext& ctx, const std::vector<PlotSeries>& series,
                       const std::string& png_path) {
  // Pareto frontier over every point: sorted by throughput, descending, keep the
  // points whose TPOT beats all those with more throughput.
  std::vector<SweepPoint> all;
  for (const PlotSeries& s : series) all.insert(all.end(), s.points.begin(), s.points.end());
  std::sort(all.begin(), all.end(), [](const SweepPoint& a, const SweepPoint& b) {
    return a.throughput_tokens_per_s > b.throughput_tokens_per_s;
  });
  std::vector<SweepPoint> frontier;
  double best_tpot = 1e300;
  for (const SweepPoint& p : all) {
    if (p.tpot_seconds < best_tpot) {
      frontier.push_back(p);
      best_tpot = p.tpot_seconds;
    }
  }
  auto quote = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    return out + "\"";
  };
  std::string script;
  script += "set terminal pngcairo size 1100,720 noenhanced font 'sans,10'\n";
  script += "set output " + quote(png_path) + "\n";
  script += "set title " +
            quote("tessera plan: " + ctx.model.name + " on " + ctx.cluster.name + " (prompt " +
                  std::to_string(ctx.workload.prompt_tokens) + ", output " +
                  std::to_string(ctx.workload.output_tokens) +
                  " tokens; each curve: concurrency 1, 2, 4, ...)") +
            "\n";
  script += "set xlabel 'throughput (output tokens/s, whole deployment)'\n";
  script += "set ylabel 'TPOT (ms per output token)'\n";
  script += "set logscale xy\nset grid\nset key outside right top\n";
  for (size_t i = 0; i < series.size(); ++i) {
    script += Printf("$s%zu << EOD\n", i);
    for (const SweepPoint& p : series[i].points) {
      script += Printf("%.6g %.6g %lld\n", p.throughput_tokens_per_s, p.tpot_seconds * 1e3,
                       static_cast<long long>(p.concurrency));
    }
    script += "EOD\n";
  }
  script += "$frontier << EOD\n";
  for (const SweepPoint& p : frontier) {
    script += Printf("%.6g %.6g\n", p.throughput_tokens_per_s, p.tpot_seconds * 1e3);
  }
  script += "EOD\nplot ";
  for (size_t i = 0; i < series.size(); ++i) {
    script += Printf("$s%zu using 1:2 with linespoints pt 7 ps 0.7 title %s, ", i,
                     quote(series[i].label).c_str());
  }
  script += "$frontier using 1:2 with lines lw 3 dt 2 lc rgb '#202020' title 'frontier'\n";
  return script;
}

}  // namespace tessera::plan
