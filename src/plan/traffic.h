// Communication of one forward pass (a prefill or a decode step) of one instance:
// every call each rank makes, per group and primitive, with exact per-rank bytes
// from collectives.h, and the per-pass summary items with the formula used and the
// seeds' simpler formula beside it. Layer: plan. The per-rank view is what a test
// holds against the comm ledger; the items are what `tessera plan` prints.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/collectives.h"
#include "plan/layout.h"
#include "plan/model_shape.h"
#include "plan/workload.h"

namespace tessera::plan {

enum class Phase { kPrefill, kDecode };
std::string_view PhaseName(Phase phase);

// One forward pass of one DP replica. Either uniform — num_seqs sequences of
// tokens_per_seq new tokens each, one row of logits per sequence — or, for a step
// of the engine that mixes sequences with different token counts (StepPass), the
// step's totals: total_tokens new tokens and logit_rows rows of logits (cp = 1).
// Expert parallelism as measured: the (token, choice) rows a rank's MoE combines
// sent to and received from the other ranks of its EP group over a pass, summed
// over its MoE layers (the engine's StepTraffic::ep_rows_*). Routing decides
// them, so only a run knows them; without them the planner expects uniform routing.
struct ExpertRows {
  int64_t sent = 0;
  int64_t received = 0;
};

struct Pass {
  Phase phase = Phase::kDecode;
  int64_t num_seqs = 1;                 // sequences in the pass
  int64_t tokens_per_seq = 1;           // prefill: prompt tokens; decode: 1 (a StepPass: the mean)
  int64_t context = 0;                  // decode: tokens already in each sequence's KV cache
  std::optional<int64_t> total_tokens;  // new tokens of the step, when not uniform
  std::optional<int64_t> logit_rows;    // rows of logits wanted, when not one per sequence
  std::optional<ExpertRows> expert_rows;  // EP: this rank's measured combine rows (exact bytes)
  // Data-parallel attention (ep spanning dp ranks): the pass is one dp rank's share,
  // and EP rank 0 (the driver) receives this many rows of logits from its peers
  // (default: (ep - 1) × rows(), every rank's share alike).
  std::optional<int64_t> peer_logit_rows;

  int64_t tokens() const { return total_tokens.value_or(num_seqs * tokens_per_seq); }
  int64_t rows() const { return logit_rows.value_or(num_seqs); }
};

// One step of the engine: `num_seqs` sequences bring `total_tokens` new tokens
// between them, in any mix, and `logit_rows` rows of logits are wanted (one per
// sequence, or every token when the step asks for all logits). Decode when every
// sequence brings one token, else prefill. Context parallelism must be 1.
Pass StepPass(int64_t num_seqs, int64_t total_tokens, int64_t logit_rows);

// New tokens a cp rank processes in `pass` (all of them when cp = 1).
int64_t TokensOnCpRank(const Pass& pass, const Parallelism& p, int64_t cp_rank);

// Where a rank of one instance sits (see layout.h for the rank order).
struct RankCoords {
  int64_t tp_rank = 0;
  int64_t cp_rank = 0;
  int64_t dp_rank = 0;
  int64_t stage = 0;
};
RankCoords CoordsOf(const Parallelism& p, int64_t rank);
int64_t RankOf(const Parallelism& p, const RankCoords& c);

// Named as comm's ledger names them (comm/ledger.h PrimitiveName).
enum class Primitive {
  kAllReduce,
  kAllGather,
  kGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllv,
  kSend,
  kRecv
};
std::string_view PrimitiveName(Primitive primitive);

// One kind of call a rank makes `calls` times in a pass.
struct CommCall {
  std::string group;  // "tp", "pp", "ep", "cp"
  Primitive primitive = Primitive::kAllReduce;
  std::string algorithm;  // "ring", "recursive-doubling", "two-shot", "bruck", "direct",
                          // "pairwise", "p2p"
  std::string what;  // "embedding", "layer outputs", "expert outputs", "logits", "activations", …
  int64_t calls = 0;
  int64_t group_size = 1;
  int64_t rank_in_group = 0;
  int64_t elems_per_call = 0;  // M in elements: the whole buffer of one call (a gather's:
                               // the root's, P blocks)
  int64_t elem_bytes = 0;
  RankBytes bytes_per_call;     // this rank's share
  double seconds_per_call = 0;  // alpha-beta, slowest rank of the group
  bool crosses_nodes = false;
  bool expected = false;  // EP: a uniform-routing expectation, not an exact count
  // EP with measured rows: the pass's bytes over all `calls` (routing makes them
  // differ call to call, so there is no exact per-call figure).
  std::optional<RankBytes> total_bytes;
};

// Where an instance's devices start in the cluster (for node boundaries).
struct Placement {
  int64_t first_device = 0;
};

// Every call `rank` of an instance with parallelism `p` makes in `pass`: for
// tp/pp layouts, exactly the engine's (engine/stage_runner.h) data traffic, which
// `tessera generate --ledger` records per step; its control messages (the "ctl"
// group) are not modelled (docs/plan.md).
std::vector<CommCall> RankCalls(const ModelShape& model, const Cluster& cluster,
                                const Workload& workload, const Parallelism& p, const Pass& pass,
                                int64_t rank, const Placement& placement = {});

// What comm's ledger would show for `rank`: bytes and call counts per
// "group/primitive", e.g. "tp/all_reduce", "tp/gather", "pp/send", "ep/all_to_allv".
struct LedgerEntry {
  RankBytes bytes;
  int64_t calls = 0;
};
std::map<std::string, LedgerEntry> PredictLedger(const std::vector<CommCall>& calls);

// One line of the per-pass communication table, over all ranks of the instance.
struct CommItem {
  std::string group;
  std::string primitive;
  std::string algorithm;
  std::string what;
  int64_t group_size = 1;
  int64_t calls_per_rank = 0;  // on the busiest rank
  int64_t message_bytes = 0;   // M of one call
  RankBytes max_rank;          // busiest rank's bytes over the pass
  int64_t total_sent = 0;      // all ranks of the instance, over the pass
  bool crosses_nodes = false;
  bool expected = false;
  std::string formula;       // the exact formula with its figures
  std::string seed_formula;  // the seeds' formula ("" when the seeds give none)
  double seed_bytes = -1;    // the seeds' figure for the same quantity, -1 if none
  std::string note;          // where and why they differ
};

std::vector<CommItem> PassCommItems(const ModelShape& model, const Cluster& cluster,
                                    const Workload& workload, const Parallelism& p,
                                    const Pass& pass, const Placement& placement = {});

// Prefill/decode disaggregation: KV bytes of one request moved from the prefill to
// the decode instance: prompt × layers × kv_elems_per_token_layer × kv dtype bytes,
// where kv_elems_per_token_layer = 2 × kv_heads × head_dim (or the MLA latent).
int64_t KvTransferBytes(const ModelShape& model, const DType& kv_dtype, int64_t tokens);
CommItem KvTransferItem(const ModelShape& model, const Workload& workload,
                        const Parallelism& prefill, bool crosses_nodes);

}  // namespace tessera::plan
