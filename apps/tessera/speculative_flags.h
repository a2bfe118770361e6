// The speculative-decoding flags `generate` and `serve` share: --speculative
// ngram|draft:PATH and --spec-tokens K, the proposer they make, and the summary
// of a run's guesses for a stats line. Layer: apps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "model/tokenizer.h"

namespace CLI {
class App;
}

namespace tessera::cli {

struct SpeculativeFlags {
  std::string proposer;  // "" (off), "ngram" or "draft:PATH"
  int32_t tokens = 4;    // guesses per step at most (serve: for requests that do not say)
  int32_t ngram_max = 4;
  int draft_threads = 0;           // 0: the driver rank's threads
  int64_t draft_kv_tokens = 8192;  // the draft's KV cache, shared by its sequences
  int32_t max_batch = 0;           // serve: no guesses while more sequences decode
};

// `server`: --spec-tokens is the default of requests that do not say ("spec_tokens").
void AddSpeculativeFlags(CLI::App* cmd, SpeculativeFlags* flags, bool server);

// InvalidArgument for an unknown kind, a bad --spec-tokens or --spec-ngram
// (checked before any rank starts).
Status ValidateSpeculativeFlags(const SpeculativeFlags& flags);

// The proposer the flags ask for (null when --speculative is not given), for a
// target with `target`'s vocabulary: a draft model is loaded here, on the driver
// rank (`rank_threads`: its compute threads, the draft's default), and refused
// when its vocabulary differs.
Result<std::shared_ptr<engine::Proposer>> MakeProposer(const SpeculativeFlags& flags,
                                                       const model::Tokenizer& target,
                                                       int rank_threads);

// Sets the scheduler's proposer and spec_tokens from the flags.
Status ApplySpeculativeFlags(const SpeculativeFlags& flags, const model::Tokenizer& target,
                             int rank_threads, engine::SchedulerOptions& options);

// " | speculative ngram: 300/400 guesses accepted (0.75), 2.31 per verification",
// or "" when speculation is off.
std::string SpeculationSummary(const engine::SchedulerStats& stats);

}  // namespace tessera::cli
