// RankReport: where one rank's time and bytes went — per step class (decode,
// prefill) the time computing, communicating and waiting, its memory, its links,
// and (when recorded) every step's ledger delta — and the wire form in which a
// worker sends it to the driver at shutdown: a flat list of int64 words (strings
// as a length and bytes packed into words), decoded with every count checked.
// Layer: engine. Plain values.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/ledger.h"

namespace tessera::engine {

// Where one rank's time went, per step class (decode: every sequence brings one
// token; prefill: any other step).
struct TimeShare {
  int64_t steps = 0;
  int64_t compute_ns = 0;  // kernels
  int64_t comm_ns = 0;     // all-reduces, gathers, sends (includes waiting for slower peers)
  int64_t wait_ns = 0;     // idle, waiting for the upstream stage's message and activations
};

// Bytes one rank moved in one step, per "group/primitive" (ledger names).
// Under data-parallel attention (parallel::Partition::dp) sequences, tokens, context
// and logit_rows are this rank's share of the step.
struct StepTraffic {
  uint64_t step_id = 0;
  bool decode = false;
  int64_t sequences = 0;
  int64_t tokens = 0;   // new tokens of the step
  int64_t context = 0;  // tokens cached before the step, summed over sequences
  int64_t logit_rows = 0;
  std::map<std::string, comm::LedgerEntry> bytes;
  // Expert parallelism: (token, choice) rows this rank sent to / received from
  // other EP ranks in the step's MoE combines, summed over its layers
  // (plan::ExpertRows; the ledger's "ep/all_to_allv" bytes are rows × dim × 4).
  int64_t ep_rows_sent = 0;
  int64_t ep_rows_received = 0;
  int64_t expert_rows_computed = 0;  // EP: (token, choice) rows this rank's experts ran
  std::vector<int64_t> expert_rows;  // [num_experts] rows routed to each expert (MoE; EP:
                                     // over this rank's EP group's tokens; data-parallel
                                     // attention: over this rank's own)
};

struct RankReport {
  int rank = 0;
  int stage = 0;
  int tp_rank = 0;
  int64_t weight_bytes = 0;      // the shard's weights
  int64_t kv_bytes = 0;          // its KV cache
  int64_t peak_rss_bytes = 0;    // VmHWM
  int64_t activation_bytes = 0;  // the forward pass's scratch at its largest step
  std::string links;             // transport to each world rank: "shm shm tcp tcp"
  TimeShare decode, prefill;
  // MoE load: (token, choice) rows routed to each expert in this rank's layers,
  // every step ([num_experts]; under EP over its EP group's tokens, all of which
  // ran on the experts' owners).
  std::vector<int64_t> expert_rows_total;
  // EP: the same for each layer of the rank's stage ([layers, num_experts], its
  // first layer first), what per-layer placement balances.
  std::vector<int64_t> expert_rows_by_layer;
  // EP: the (token, choice) rows this rank's experts computed, all steps and layers
  // (with replicas, the rank's real load; expert_rows_total is its group's routing).
  int64_t expert_rows_computed = 0;
  std::vector<StepTraffic> traffic;  // recorded when RuntimeOptions asks (driver's report)
  // The rank's ledgers so far, per "group/primitive" ("tp/all_reduce", "ctl/send", …;
  // primitives never used are left out).
  std::map<std::string, comm::LedgerEntry> ledger;
};

// The report as words, and back. DecodeRankReport refuses truncated input and
// counts or lengths out of range (InvalidArgument): it comes from another process.
std::vector<int64_t> EncodeRankReport(const RankReport& report);
Result<RankReport> DecodeRankReport(std::span<const int64_t> words);

// This process's peak resident memory (VmHWM), 0 if unknown.
int64_t PeakRssBytes();

}  // namespace tessera::engine
