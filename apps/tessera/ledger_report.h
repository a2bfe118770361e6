// `tessera generate --ledger`: every step's measured communication, per group and
// primitive, held against the exact model (plan/'s per-rank prediction for the
// step's shape) and the seeds' formulas, with differences above 1% flagged.
// Layer: apps.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/stage_runner.h"
#include "model/gguf.h"
#include "parallel/partition.h"

namespace tessera::cli {

// kv_type: the run's KV cache type ("f16", "f32"), which context parallelism's K/V
// exchange moves.
Result<std::string> FormatLedger(const model::GgufFile& file, const parallel::Partition& plan,
                                 bool deterministic, const std::string& kv_type,
                                 const std::vector<engine::RankReport>& reports);

// Expert-parallel load: (token, choice) rows per expert and per EP rank, summed
// over the MoE layers, for one recorded step (`step`) or the whole run (nullopt),
// with the most loaded rank over the mean. For --ledger and the per-rank report.
std::string ExpertLoadLine(const std::vector<engine::RankReport>& reports,
                           std::optional<size_t> step, const parallel::Partition& plan);

}  // namespace tessera::cli
