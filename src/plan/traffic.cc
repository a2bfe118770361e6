#include "plan/traffic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "base/check.h"
#include "plan/shard.h"
#include "plan/units.h"

namespace tessera::plan {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

std::string Fmt(const char* format, double a) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, a);
  return buf;
}

// The link a group's traffic crosses: inter-node when its devices span nodes.
Link GroupLink(const Cluster& cluster, const Placement& placement,
               const std::vector<int64_t>& member_ranks, bool* crosses) {
  std::set<int64_t> nodes;
  for (int64_t r : member_ranks)
    nodes.insert((placement.first_device + r) / cluster.devices_per_node);
  *crosses = nodes.size() > 1;
  return *crosses ? cluster.inter_link : cluster.intra_link;
}

// Sequence parallelism's pieces (parallel/sequence_shard.h, which the engine
// uses): a step's rows in chunks of 256, each split into tp pieces of ⌈n/tp⌉ rows.
// Returns {piece rows, chunks with that piece}, at most two kinds.
constexpr int64_t kSequenceChunkTokens = 256;
std::vector<std::pair<int64_t, int64_t>> SequencePieces(int64_t tokens, int64_t tp) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int64_t row = 0; row < tokens; row += kSequenceChunkTokens) {
    const int64_t n = std::min(kSequenceChunkTokens, tokens - row);
    const int64_t piece = (n + tp - 1) / tp;
    if (!pieces.empty() && pieces.back().first == piece) {
      ++pieces.back().second;
    } else {
      pieces.push_back({piece, 1});
    }
  }
  return pieces;
}

}  // namespace

std::string_view PhaseName(Phase phase) { return phase == Phase::kPrefill ? "prefill" : "decode"; }

std::string_view PrimitiveName(Primitive primitive) {
  switch (primitive) {
    case Primitive::kAllReduce:
      return "all_reduce";
    case Primitive::kAllGather:
      return "all_gather";
    case Primitive::kGather:
      return "gather";
    case Primitive::kReduceScatter:
      return "reduce_scatter";
    case Primitive::kAllToAll:
      return "all_to_all";
    case Primitive::kAllToAllv:
      return "all_to_allv";
    case Primitive::kSend:
      return "send";
    case Primitive::kRecv:
      return "recv";
  }
  return "?";
}

Pass StepPass(int64_t num_seqs, int64_t total_tokens, int64_t logit_rows) {
  TESSERA_CHECK(num_seqs >= 1 && total_tokens >= num_seqs && logit_rows >= 0)
      << num_seqs << " sequences, " << total_tokens << " tokens, " << logit_rows << " rows";
  Pass pass;
  pass.phase = total_tokens == num_seqs ? Phase::kDecode : Phase::kPrefill;
  pass.num_seqs = num_seqs;
  pass.tokens_per_seq = total_tokens / num_seqs;
  pass.total_tokens = total_tokens;
  pass.logit_rows = logit_rows;
  return pass;
}

int64_t TokensOnCpRank(const Pass& pass, const Parallelism& p, int64_t cp_rank) {
  if (pass.total_tokens) {
    TESSERA_CHECK_EQ(p.cp, 1) << "a pass of mixed token counts needs cp = 1";
    return *pass.total_tokens;
  }
  return TokensOnCpRank(pass.num_seqs, pass.tokens_per_seq, pass.phase == Phase::kPrefill, p,
                        cp_rank);
}

RankCoords CoordsOf(const Parallelism& p, int64_t rank) {
  RankCoords c;
  c.tp_rank = rank % p.tp;
  rank /= p.tp;
  c.cp_rank = rank % p.cp;
  rank /= p.cp;
  c.dp_rank = rank % p.dp;
  c.stage = rank / p.dp;
  return c;
}

int64_t RankOf(const Parallelism& p, const RankCoords& c) {
  return ((c.stage * p.dp + c.dp_rank) * p.cp + c.cp_rank) * p.tp + c.tp_rank;
}

std::vector<CommCall> RankCalls(const ModelShape& m, const Cluster& cluster, const Workload& w,
                                const Parallelism& p, const Pass& pass, int64_t rank,
                                const Placement& placement) {
  std::vector<CommCall> calls;
  const RankCoords c = CoordsOf(p, rank);
  const LayerRange layers = StageLayers(m.num_layers, p.pp, c.stage);
  const bool prefill = pass.phase == Phase::kPrefill;
  const int64_t act_bytes = w.act_dtype.block_bytes / w.act_dtype.block_elems;
  const int64_t h = m.dim;
  const int64_t t_cp = TokensOnCpRank(pass, p, c.cp_rank);

  int64_t moe_layers = 0;
  for (int64_t l = layers.first; l < layers.end; ++l) moe_layers += m.IsMoeLayer(l) ? 1 : 0;
  const bool ep_moe = p.ep > 1 && moe_layers > 0;

  if (p.tp > 1) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < p.tp; ++i)
      members.push_back(RankOf(p, {i, c.cp_rank, c.dp_rank, c.stage}));
    bool crosses = false;
    const Link link = GroupLink(cluster, placement, members, &crosses);
    auto all_reduce = [&](const char* what, int64_t n, int64_t count) {
      if (n == 0 || count == 0) return;
      // One-shot needs the group on one host (comm's shared-memory mailbox).
      const AllReduceThresholds thresholds{w.allreduce_small_bytes,
                                           crosses ? 0 : w.allreduce_oneshot_bytes};
      AllReduceAlgo algo =
          w.allreduce_algo.value_or(LibraryAllReduceChoice(count * act_bytes, thresholds));
      if (algo == AllReduceAlgo::kOneShot && !thresholds.OneShotFits(count * act_bytes)) {
        algo = LibraryAllReduceChoice(count * act_bytes, thresholds);  // as comm falls back
      }
      if (algo == AllReduceAlgo::kDeterministic) {
        algo = DeterministicAllReduceChoice(count * act_bytes, thresholds, p.tp);
      }
      CommCall call{"tp",
                    Primitive::kAllReduce,
                    std::string(AllReduceAlgoName(algo)),
                    what,
                    n,
                    p.tp,
                    c.tp_rank,
                    count,
                    act_bytes};
      call.bytes_per_call = AllReduceBytes(algo, count, act_bytes, p.tp, c.tp_rank);
      call.seconds_per_call = AllReduceSeconds(algo, count, act_bytes, p.tp, link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
    };
    // comm's all-gather takes equal blocks: uneven shards are padded to the largest.
    auto all_gather = [&](const char* what, int64_t n, int64_t block_bytes, int64_t elems,
                          int64_t elem_bytes) {
      const AllGatherAlgo ag = w.allgather_algo.value_or(
          LibraryAllGatherChoice(block_bytes, p.tp, w.allgather_small_bytes));
      CommCall call{"tp",
                    Primitive::kAllGather,
                    std::string(AllGatherAlgoName(ag)),
                    what,
                    n,
                    p.tp,
                    c.tp_rank,
                    elems,
                    elem_bytes};
      call.bytes_per_call = AllGatherBytes(block_bytes, p.tp);
      call.seconds_per_call = AllGatherSeconds(ag, block_bytes, p.tp, link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
    };
    // The deterministic reduce-scatter of tp blocks of `block_elems`.
    auto reduce_scatter = [&](const char* what, int64_t n, int64_t block_elems) {
      const int64_t block_bytes = block_elems * act_bytes;
      CommCall call{"tp",      Primitive::kReduceScatter, "deterministic", what, n, p.tp,
                    c.tp_rank, block_elems * p.tp,        act_bytes};
      call.bytes_per_call = DeterministicReduceScatterBytes(block_bytes, p.tp);
      call.seconds_per_call = DeterministicReduceScatterSeconds(block_bytes, p.tp, link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
    };
    const int64_t count = t_cp * h;  // [T, H]
    if (p.SequenceParallelFor(t_cp)) {
      // Sequence parallelism (dense layers): per chunk of the step's rows, the
      // embedding's partial sums reduce-scattered into pieces; each block all-
      // gathers its normalised pieces and reduce-scatters its output; the last
      // stage all-reduces the logit rows (each from the rank holding it, -0.0
      // elsewhere) before the vocab-sharded head.
      for (const auto& [piece, chunks] : SequencePieces(t_cp, p.tp)) {
        if (c.stage == 0) reduce_scatter("embedding", chunks, piece * h);
        all_gather("block inputs", 2 * layers.size() * chunks, piece * h * act_bytes,
                   piece * p.tp * h, act_bytes);
        reduce_scatter("block outputs", 2 * layers.size() * chunks, piece * h);
      }
      if (c.stage == p.pp - 1) all_reduce("head rows", 1, pass.rows() * h);
    } else {
      if (c.stage == 0) all_reduce("embedding", 1, count);
      // Every layer all-reduces its attention output, a dense layer its FFN output
      // too: [T, H] each. An MoE layer without EP all-reduces, in one call before
      // mixing, each (token, choice) expert output and the shared expert's output:
      // [T·K + T_shared, H]; an EP MoE layer all-gathers its token split instead.
      const int64_t dense_layers = layers.size() - moe_layers;
      all_reduce("layer outputs", layers.size() + dense_layers, count);
      if (!ep_moe) {
        const int64_t shared_rows = m.num_shared_experts > 0 ? t_cp : 0;
        all_reduce("expert outputs", moe_layers, (t_cp * m.num_experts_used + shared_rows) * h);
      }
    }
    if (ep_moe) {
      const int64_t rows = ChunkElems(t_cp, p.tp, 0);  // the largest token share
      all_gather("moe outputs", moe_layers, rows * h * act_bytes, rows * p.tp * h, act_bytes);
    }
    // Every cp rank has the logits (context_blocks.h); each one's tp group gathers them.
    const bool has_logits = c.stage == p.pp - 1;
    if (has_logits) {
      // The wanted rows of logits, f32, gathered from the vocab shards (each padded
      // to ⌈V/tp⌉) to tp rank 0 of the last stage, the driver.
      const int64_t block = pass.rows() * VocabRowsOfRank(m, p, 0);  // [R, ⌈V/tp⌉]
      CommCall call{"tp", Primitive::kGather, "direct",     "logits", 1,
                    p.tp, c.tp_rank,          block * p.tp, 4};
      call.bytes_per_call = GatherBytes(block * 4, p.tp, c.tp_rank, /*root=*/0);
      call.seconds_per_call = GatherSeconds(block * 4, p.tp, link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
    }
  }

  if (ep_moe) {
    // The EP group: ep consecutive ranks of this stage's tp×dp ranks (cp is 1).
    const int64_t idx = c.dp_rank * p.tp + c.tp_rank;
    const int64_t first = idx / p.ep * p.ep;
    std::vector<int64_t> members;
    std::vector<double> tokens;  // tokens each member dispatches
    for (int64_t j = 0; j < p.ep; ++j) {
      const int64_t tp_j = (first + j) % p.tp;
      const int64_t dp_j = (first + j) / p.tp;
      members.push_back(RankOf(p, {tp_j, 0, dp_j, c.stage}));
      tokens.push_back(static_cast<double>(p.tp > 1 ? ChunkElems(t_cp, p.tp, tp_j) : t_cp));
    }
    bool crosses = false;
    const Link link = GroupLink(cluster, placement, members, &crosses);
    const double k_h = static_cast<double>(m.num_experts_used * h);
    const int64_t me = idx - first;
    // The combine returns each (token, choice) output to the token's rank; under
    // uniform routing (ep-1)/ep of a rank's k·T copies come from other ranks.
    // Dispatch is the mirror image, except when the EP group lies inside one tp
    // group (ep divides tp, the engine's --ep): its residual stream is replicated,
    // so an expert's rank reads its peers' token rows from its own copy and
    // dispatch moves nothing (model/moe_ep.h). Across DP replicas it must send.
    double combine_sent = 0, combine_received = 0;
    for (int64_t j = 0; j < p.ep; ++j) {
      if (j == me) continue;
      combine_sent += tokens[j] * k_h / p.ep * act_bytes;
      combine_received += tokens[me] * k_h / p.ep * act_bytes;
    }
    const bool replicated = p.tp % p.ep == 0;
    for (const char* what : {"moe dispatch", "moe combine"}) {
      const bool dispatch = what[4] == 'd';
      if (dispatch && replicated) continue;
      CommCall call{"ep",       Primitive::kAllToAllv,
                    "pairwise", what,
                    moe_layers, p.ep,
                    me,         static_cast<int64_t>(tokens[me]) * m.num_experts_used * h,
                    act_bytes};
      const double sent = dispatch ? combine_received : combine_sent;
      const double received = dispatch ? combine_sent : combine_received;
      call.bytes_per_call = {std::llround(sent), std::llround(received)};
      call.seconds_per_call = AllToAllSeconds(std::max(sent, received), p.ep, link);
      call.crosses_nodes = crosses;
      if (pass.expert_rows) {  // the combine's rows; the dispatch is their mirror image
        const RankBytes combine{pass.expert_rows->sent * h * act_bytes,
                                pass.expert_rows->received * h * act_bytes};
        call.total_bytes = dispatch ? RankBytes{combine.received, combine.sent} : combine;
      } else {
        call.expected = true;
      }
      calls.push_back(call);
    }
    if (!replicated) {
      // Data-parallel attention (model/moe_dp.h): before each dispatch, every rank
      // tells each peer how many rows of each expert it sends (i64 counts).
      const int64_t counts = m.num_experts * 8;
      CommCall call{"ep", Primitive::kAllToAll, "pairwise", "moe counts", moe_layers, p.ep,
                    me,   m.num_experts * p.ep, 8};
      call.bytes_per_call = {(p.ep - 1) * counts, (p.ep - 1) * counts};
      call.seconds_per_call = AllToAllSeconds(static_cast<double>(counts), p.ep, link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
      // The last stage's rows of logits go to EP rank 0, the driver, which puts
      // them in the step's order.
      if (c.stage == p.pp - 1) {
        const int64_t row_bytes = m.vocab_size * 4;
        const int64_t peer_rows = pass.peer_logit_rows.value_or((p.ep - 1) * pass.rows());
        const int64_t rows = me == 0 ? peer_rows : pass.rows();
        if (rows > 0) {
          CommCall logits{"ep",
                          me == 0 ? Primitive::kRecv : Primitive::kSend,
                          "p2p",
                          "logits",
                          me == 0 ? p.ep - 1 : 1,
                          p.ep,
                          me,
                          rows * m.vocab_size,
                          4};
          logits.total_bytes =
              RankBytes{me == 0 ? 0 : rows * row_bytes, me == 0 ? rows * row_bytes : 0};
          logits.seconds_per_call = SendRecvSeconds(static_cast<double>(rows * row_bytes), link);
          logits.crosses_nodes = crosses;
          calls.push_back(logits);
        }
      }
    }
  }

  if (p.cp > 1) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < p.cp; ++i)
      members.push_back(RankOf(p, {c.tp_rank, i, c.dp_rank, c.stage}));
    bool crosses = false;
    const Link link = GroupLink(cluster, placement, members, &crosses);
    // Every cp all-gather of the engine moves equal blocks (the largest rank's share,
    // padded) of f32, or of K/V in the cache's type when that is f16 (the engine
    // converts its own rows before the exchange).
    auto all_gather = [&](const char* what, int64_t n, int64_t block_elems,
                          int64_t elem_bytes = 4) {
      if (n == 0) return;
      CommCall call{"cp",      Primitive::kAllGather, "ring",    what, n, p.cp,
                    c.cp_rank, block_elems * p.cp,    elem_bytes};
      call.bytes_per_call = AllGatherBytes(block_elems * elem_bytes, p.cp);
      call.seconds_per_call =
          (p.cp - 1) * link.SecondsFor(static_cast<double>(block_elems * elem_bytes));
      call.crosses_nodes = crosses;
      calls.push_back(call);
    };
    if (prefill) {
      // A whole prompt split by span: each layer passes every rank's K and V rows
      // (the most rows of any rank; f16 with an f16 cache, else f32) around the ring,
      // cp-1 steps of one block sent to the next rank and one received from the
      // previous (model/context_blocks.h); the last stage all-gathers the logit rows.
      // A step's send and receive overlap: its time is charged once, to the send.
      int64_t most = 0;
      for (int64_t i = 0; i < p.cp; ++i) {
        most = std::max(most, TokensOnCpRank(pass.num_seqs, pass.tokens_per_seq, true, p, i));
      }
      const int64_t kv_elem_bytes = w.kv_dtype.name == "f16" ? 2 : 4;
      const int64_t block_elems = most * KvElemsPerTokenLayerPerRank(m, p);
      const int64_t block_bytes = block_elems * kv_elem_bytes;
      for (const Primitive primitive : {Primitive::kSend, Primitive::kRecv}) {
        const bool send = primitive == Primitive::kSend;
        CommCall call{"cp", primitive, "ring",      "kv rows",    layers.size() * (p.cp - 1),
                      p.cp, c.cp_rank, block_elems, kv_elem_bytes};
        call.bytes_per_call = {send ? block_bytes : 0, send ? 0 : block_bytes};
        call.seconds_per_call = send ? link.SecondsFor(static_cast<double>(block_bytes)) : 0;
        call.crosses_nodes = crosses;
        calls.push_back(call);
      }
      if (c.stage == p.pp - 1) all_gather("head rows", 1, pass.rows() * h);
    } else {
      // Decode: each rank's span partials of every query (weighted V sums, maxima,
      // sums: head_dim + 2 floats a head and span), in slots of the most spans a rank
      // holds, all-gathered once a layer and folded in span order.
      const int64_t n_spans = pass.context / kCpSpanTokens + 1;
      int64_t slots = 0;
      for (int64_t i = 0; i < p.cp; ++i) slots = std::max(slots, CpSpansOnRank(n_spans, p.cp, i));
      all_gather("attention partials", layers.size(),
                 pass.num_seqs * slots * HeadsPerRank(m, p) * (m.head_dim + 2));
    }
  }

  if (p.pp > 1) {
    // Point-to-point on the PP group: a send on one side, a recv on the other.
    auto p2p = [&](const char* what, bool send, int64_t peer, int64_t elems, int64_t elem_bytes) {
      bool crosses = false;
      const Link link = GroupLink(cluster, placement, {rank, peer}, &crosses);
      const int64_t bytes = elems * elem_bytes;
      CommCall call{"pp",      send ? Primitive::kSend : Primitive::kRecv,
                    "p2p",     what,
                    1,         p.pp,
                    c.stage,   elems,
                    elem_bytes};
      call.bytes_per_call = {send ? bytes : 0, send ? 0 : bytes};
      call.seconds_per_call = SendRecvSeconds(static_cast<double>(bytes), link);
      call.crosses_nodes = crosses;
      calls.push_back(call);
    };
    // Each tp rank passes its residual stream on: every row, or under sequence
    // parallelism its pieces (padding included).
    int64_t rows = t_cp;
    if (p.SequenceParallelFor(t_cp)) {
      rows = 0;
      for (const auto& [piece, chunks] : SequencePieces(t_cp, p.tp)) rows += piece * chunks;
    }
    if (c.stage < p.pp - 1) {
      p2p("activations", true, RankOf(p, {c.tp_rank, c.cp_rank, c.dp_rank, c.stage + 1}), rows * h,
          act_bytes);
    }
    if (c.stage > 0) {
      p2p("activations", false, RankOf(p, {c.tp_rank, c.cp_rank, c.dp_rank, c.stage - 1}), rows * h,
          act_bytes);
    }
    // The step's description (token ids, positions, block tables) travels on the
    // engine's "ctl" group, apart from the data: not modelled (docs/plan.md).
  }
  return calls;
}

std::map<std::string, LedgerEntry> PredictLedger(const std::vector<CommCall>& calls) {
  std::map<std::string, LedgerEntry> ledger;
  for (const CommCall& call : calls) {
    LedgerEntry& entry = ledger[call.group + "/" + std::string(PrimitiveName(call.primitive))];
    entry.bytes += call.total_bytes ? *call.total_bytes : call.bytes_per_call.Times(call.calls);
    entry.calls += call.calls;
  }
  return ledger;
}

namespace {

// Fills formula, seed formula/figure and note of an aggregated item.
void Describe(const ModelShape& m, const Workload& w, const Parallelism& p, const Pass& pass,
              CommItem& item) {
  const int64_t P = item.group_size;
  const double M = static_cast<double>(item.message_bytes);
  const int64_t b = w.act_dtype.block_bytes / w.act_dtype.block_elems;
  const int64_t t = pass.tokens();
  const std::string tokens =
      pass.total_tokens               ? S(t) + " tokens of " + S(pass.num_seqs) + " sequences"
      : pass.phase == Phase::kPrefill ? S(pass.num_seqs) + "x" + S(pass.tokens_per_seq) + " tokens"
                                      : S(pass.num_seqs) + " tokens";
  const std::string per_rank = "busiest rank sends " + FormatBytes(item.max_rank.sent) +
                               " and receives " + FormatBytes(item.max_rank.received) + " over " +
                               S(item.calls_per_rank) + " call(s)";
  const std::string factor =
      item.algorithm == "recursive-doubling" ? "log2(P)*M (recursive doubling)"
      : item.algorithm == "one-shot"
          ? "(P-1)*M = " + FormatBytes(static_cast<double>(P - 1) * M) +
                " (one-shot: every rank reads the others' buffers from shared memory)"
          : "2(P-1)/P*M = " + FormatBytes(2.0 * (P - 1) / P * M) + " (" + item.algorithm + ")";
  // Seeds (002): C_TP_fwd = 2*B*S*H/P per layer, i.e. B*S*H/P for each of its two
  // all-reduces; the figure for the all-reduces of an item on the busiest rank.
  auto seed_tp = [&] {
    item.seed_formula = "C_TP = 2*B*S*H/P per layer = B*S*H/P per all-reduce (x " +
                        S(item.calls_per_rank) + " all-reduces, x " + S(b) + " B)";
    item.seed_bytes = static_cast<double>(t) * m.dim / P * item.calls_per_rank * b;
    return item.seed_bytes > 0 ? item.max_rank.sent / item.seed_bytes : 0;
  };
  if (item.what == "embedding" || item.what == "layer outputs") {
    item.formula = "all-reduce of T*H*b = " + tokens + " x " + S(m.dim) + " x " + S(b) +
                   " B = " + FormatBytes(M) + "; per rank " + factor + "; " + per_rank;
    if (item.what == "layer outputs") {
      const double ratio = seed_tp();
      item.note =
          "each layer runs 2 all-reduces of the whole B*S*H*b activation; a ring sends "
          "2(P-1)/P of it per rank each time (4(P-1)/P*B*S*H*b per layer, 2(P-1)x the "
          "seeds' figure; their ring '~2M' is 2(P-1)/P*M per rank); with " +
          item.algorithm + " the busiest rank sends " + Fmt("%.3g", ratio) + "x the seeds' figure";
      if (m.is_moe() && p.ep == 1) {
        item.note += "; an MoE layer's second all-reduce is 'expert outputs'";
      }
    } else {
      item.note = "not in the seeds: the vocab-parallel embedding sums its shards' rows";
    }
  } else if (item.what == "expert outputs") {
    const bool shared = m.num_shared_experts > 0;
    item.formula = "all-reduce of (T*K" + std::string(shared ? " + T" : "") + ")*H*b = (" + S(t) +
                   " x " + S(m.num_experts_used) + (shared ? " + " + S(t) : std::string()) +
                   ") x " + S(m.dim) + " x " + S(b) + " B = " + FormatBytes(M) +
                   " per MoE layer; per rank " + factor + "; " + per_rank;
    const double ratio = seed_tp();
    item.note =
        "tessera's engine all-reduces every (token, choice) expert output" +
        std::string(shared ? " and the shared expert's" : "") + " before mixing them, " +
        S(m.num_experts_used + (shared ? 1 : 0)) +
        "x the B*S*H the seeds count for the FFN (mixing first would send B*S*H); the busiest "
        "rank sends " +
        Fmt("%.3g", ratio) + "x the seeds' figure";
  } else if (item.what == "logits" && item.group == "ep") {
    item.formula = "each dp rank's R rows of logits, R x V x 4 B = " +
                   FormatBytes(static_cast<double>(pass.rows() * m.vocab_size * 4)) +
                   " (R = " + S(pass.rows()) +
                   "), sent to EP rank 0 (the driver), which receives every peer's: " + per_rank;
    item.note = "not in the seeds (they count the layers only)";
  } else if (item.what == "moe counts") {
    item.formula = "all-to-all of each (peer, expert) row count before each dispatch, " +
                   S(m.num_experts) + " i64 to each of P-1 peers: (P-1) x E x 8 B = " +
                   FormatBytes(static_cast<double>((P - 1) * m.num_experts * 8)) +
                   " per MoE layer; " + per_rank;
    item.note = "not in the seeds: data-parallel attention's ranks learn what they will receive";
  } else if (item.what == "logits") {
    item.formula =
        "gather of the vocab shards to tp rank 0 (the driver), each padded to ceil(V/tp) rows: "
        "R x ceil(V/P) x 4 B = " +
        FormatBytes(M / P) + " per rank, R = " + S(pass.rows()) +
        "; the root receives P-1 blocks, the others send one: " + per_rank;
    item.note =
        "not in the seeds (they count the layers only); R is one row per sequence (every "
        "token when a step wants all logits)";
  } else if (item.what == "moe outputs") {
    item.formula =
        "all-gather of the token-split MoE output (ceil(T/P)*H*b per rank, padded), "
        "(P-1) blocks per rank (" +
        item.algorithm + "); " + per_rank;
    item.note =
        "EP MoE layers split tokens over tp and gather them back (instead of the "
        "FFN all-reduce)";
  } else if (item.what == "moe dispatch" || item.what == "moe combine") {
    const bool replicated = p.tp % p.ep == 0;
    item.formula =
        "pairwise all-to-allv: each token's top-" + S(m.num_experts_used) +
        " copies of H*b, (ep-1)/ep of them cross ranks (uniform routing; exact with measured "
        "rows)" +
        std::string(replicated ? "; dispatch moves nothing (the tp group's activations are "
                                 "replicated, an expert's rank reads them from its own copy)"
                               : "") +
        ": " + per_rank;
    // The seed figure goes on the first EP item: dispatch, or the combine alone.
    if (item.what == "moe dispatch" || replicated) {
      const int64_t layers = item.calls_per_rank;
      const double rank_tokens =
          static_cast<double>(item.message_bytes) / (m.num_experts_used * m.dim * b);
      item.seed_formula = "C_EP = 2*tokens*topk*H*b per MoE layer (dispatch+combine)";
      item.seed_bytes = 2.0 * rank_tokens * m.num_experts_used * m.dim * b * layers;
      item.note =
          "the seeds count dispatch and combine together and include the copies that stay on "
          "the rank; exact: (ep-1)/ep of them cross" +
          std::string(replicated ? ", and only the combine moves (dispatch reads the "
                                   "replicated activations)"
                                 : ", for each direction");
    }
  } else if (item.what == "kv rows") {
    item.formula =
        "each rank's K and V rows (its 256-token spans, zig-zag; in an f16 cache's type, "
        "else f32; padded to the busiest rank's) passed around the ring once per layer: "
        "cp-1 steps, each sending one block to the next rank and receiving one, overlapped "
        "with the attention of the rows whose positions are in hand: " +
        per_rank;
    item.note =
        "the seeds name CP's KV exchange without a formula; causal masking could skip "
        "sending a block to the ranks whose rows all precede it (not done)";
  } else if (item.what == "head rows") {
    item.formula =
        "all-gather of the logit rows (R x H x 4 B), each normalised by its owner: " + per_rank;
    item.note = "not in the seeds";
  } else if (item.what == "attention partials") {
    item.formula =
        "all-gather of each rank's span partials, B x (most spans a rank holds) x heads/tp x "
        "(head_dim+2) x 4 B per rank per layer: " +
        per_rank;
    // The alternative: after the prefill, gather each sequence's KV to one rank of
    // the group, which then decodes alone: the other ranks' share of the context's
    // KV (in the cache's type) once, then nothing a step.
    const double gathered = static_cast<double>(pass.num_seqs) *
                            static_cast<double>(KvTransferBytes(m, w.kv_dtype, pass.context)) *
                            static_cast<double>(P - 1) / static_cast<double>(P) /
                            static_cast<double>(p.tp);
    const double per_step = static_cast<double>(item.max_rank.received);
    item.note = "not in the seeds; gathering the " + S(pass.context) +
                "-token contexts' KV to one rank of the group instead would move " +
                FormatBytes(gathered) + " to it once (then none a step), " +
                (per_step > 0
                     ? FormatBytes(per_step) + " a step here: in bytes the gather pays off after " +
                           S(static_cast<int64_t>(gathered / per_step + 0.5)) +
                           " decode steps, and leaves one rank's KV pool holding the "
                           "whole context"
                     : std::string("nothing a step here"));
  } else if (item.what == "activations") {
    item.formula = "send/recv of T*H*b = " + tokens + " x " + S(m.dim) + " x " + S(b) +
                   " B = " + FormatBytes(M) +
                   " at each stage boundary (each tp rank sends its copy); " + per_rank;
    item.seed_formula = "C_PP = B*S*H*bytes per stage boundary";
    item.seed_bytes = static_cast<double>(t) * m.dim * b;
    item.note = item.seed_bytes == item.max_rank.sent
                    ? "same as the seeds"
                    : "cp splits the tokens of a prefill over the cp ranks";
  }
}

}  // namespace

std::vector<CommItem> PassCommItems(const ModelShape& m, const Cluster& cluster, const Workload& w,
                                    const Parallelism& p, const Pass& pass,
                                    const Placement& placement) {
  std::vector<CommItem> items;  // one per (group, what), in first-seen order
  auto find = [&](const CommCall& call) -> size_t {
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].group == call.group && items[i].what == call.what) return i;
    }
    CommItem item;
    item.group = call.group;
    const bool p2p = call.primitive == Primitive::kSend || call.primitive == Primitive::kRecv;
    item.primitive = p2p ? "send/recv" : std::string(PrimitiveName(call.primitive));
    item.algorithm = call.algorithm;
    item.what = call.what;
    item.group_size = call.group_size;
    items.push_back(item);
    return items.size() - 1;
  };
  for (int64_t rank = 0; rank < p.devices(); ++rank) {
    // This rank's totals per item (a middle pipeline stage both sends and receives).
    std::map<size_t, std::pair<RankBytes, int64_t>> mine;
    for (const CommCall& call : RankCalls(m, cluster, w, p, pass, rank, placement)) {
      const size_t i = find(call);
      CommItem& item = items[i];
      mine[i].first += call.total_bytes ? *call.total_bytes : call.bytes_per_call.Times(call.calls);
      mine[i].second += call.calls;
      item.message_bytes = std::max(item.message_bytes, call.elems_per_call * call.elem_bytes);
      item.crosses_nodes = item.crosses_nodes || call.crosses_nodes;
      item.expected = item.expected || call.expected;
    }
    for (const auto& [i, totals] : mine) {
      CommItem& item = items[i];
      item.max_rank.sent = std::max(item.max_rank.sent, totals.first.sent);
      item.max_rank.received = std::max(item.max_rank.received, totals.first.received);
      item.calls_per_rank = std::max(item.calls_per_rank, totals.second);
      item.total_sent += totals.first.sent;
    }
  }
  for (CommItem& item : items) Describe(m, w, p, pass, item);
  return items;
}

int64_t KvTransferBytes(const ModelShape& m, const DType& kv_dtype, int64_t tokens) {
  return kv_dtype.BytesOf(tokens * m.num_layers * m.KvElemsPerTokenLayer());
}

CommItem KvTransferItem(const ModelShape& m, const Workload& w, const Parallelism& prefill,
                        bool crosses_nodes) {
  CommItem item;
  item.group = "pd";
  item.primitive = "send/recv";
  item.algorithm = "p2p";
  item.what = "kv cache";
  item.group_size = 2;
  item.calls_per_rank = 1;
  const int64_t total = KvTransferBytes(m, w.kv_dtype, w.prompt_tokens);
  item.message_bytes = total;
  // Each prefill device sends its own shard (replicated KV heads are sent once) and
  // a decode device receives as much.
  const int64_t senders =
      prefill.pp * std::min(prefill.tp, m.kv_latent_dim > 0 ? 1 : m.num_kv_heads);
  item.max_rank = {(total + senders - 1) / senders, (total + senders - 1) / senders};
  item.total_sent = total;
  item.crosses_nodes = crosses_nodes;
  const std::string per_token = m.kv_latent_dim > 0
                                    ? S(m.kv_latent_dim) + " (MLA latent)"
                                    : "2 x " + S(m.num_kv_heads) + " x " + S(m.head_dim);
  item.formula = "KV = S x layers x kv_elems x b = " + S(w.prompt_tokens) + " x " +
                 S(m.num_layers) + " x " + per_token + " x " + w.kv_dtype.name + " = " +
                 FormatBytes(static_cast<double>(total)) + " per request, from " + S(senders) +
                 " prefill device(s) in parallel";
  item.seed_formula = "KV_total = B*S*2*H*layers (no dtype factor)";
  item.seed_bytes = static_cast<double>(w.prompt_tokens) * 2 * m.dim * m.num_layers;
  item.note = "the seeds use the hidden size H where the cache holds kv_heads*head_dim (" +
              S(m.KvElemsPerTokenLayer() / 2) + " vs H=" + S(m.dim) +
              " under GQA/MLA) and leave out the bytes per element";
  return item;
}

}  // namespace tessera::plan
