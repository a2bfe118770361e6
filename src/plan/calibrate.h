// "This machine, measured": the figures `tessera plan --calibrate` writes into a
// cluster file — f32 FMA throughput per thread, memory bandwidth (base's probe),
// and alpha-beta fits of `tessera bench comm --json` records for shm and TCP.
// Layer: plan. The only part of plan/ that touches the machine (MeasureFlops…);
// the fitting functions are pure.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "base/status.h"
#include "plan/cluster.h"

namespace tessera::plan {

// f32 multiply-adds per second one thread sustains in a register-resident FMA loop
// (FLOP/s, counting an FMA as 2), best of `repetitions` runs of ~`seconds` each.
double MeasureFlopsPerThread(double seconds, int repetitions);

// Fits a Link per transport from `tessera bench comm --json` output (a JSON array,
// or an object with a "records"/"results" array, of records with op, algo,
// transport, np, bytes, time_us, busbw_gbps): bandwidth = the best busbw over
// messages >= 1 MiB; latency = the smallest time_us divided by the algorithm's
// number of sequential steps (ring all-reduce 2(np-1), all-gather/reduce-scatter
// /all-to-all np-1, recursive doubling log2 np, send/recv and broadcast 1).
Result<std::map<std::string, Link>> FitLinksFromBenchJson(std::string_view json_text);

}  // namespace tessera::plan
