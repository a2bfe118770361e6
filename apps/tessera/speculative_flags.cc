#include "apps/tessera/speculative_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "engine/draft_proposer.h"

namespace tessera::cli {

void AddSpeculativeFlags(CLI::App* cmd, SpeculativeFlags* flags, bool server) {
  cmd->add_option("--speculative", flags->proposer,
                  "Speculative decoding: 'ngram' (guesses from earlier text: prompt lookup) or "
                  "'draft:PATH' (a small GGUF with the same vocabulary); the output is unchanged");
  cmd->add_option("--spec-tokens", flags->tokens,
                  server ? "Guesses per step at most for requests that do not set \"spec_tokens\" "
                           "(0: only requests that ask speculate)"
                         : "Guesses per step at most (adapted down per sequence when they fail)")
      ->capture_default_str();
  cmd->add_option("--spec-ngram", flags->ngram_max,
                  "ngram: the longest suffix looked up (down to 1 token)")
      ->capture_default_str();
  if (server) {
    flags->max_batch = 3;
    cmd->add_option("--spec-max-batch", flags->max_batch,
                    "No guesses in a step where more sequences than this decode (0: no limit): "
                    "a batched decode is no longer nearly free (the default 3 is where a 1.1B "
                    "target with a 2-layer draft broke even on 2 cores, docs/results.md)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
  }
  cmd->add_option("--draft-threads", flags->draft_threads,
                  "draft: its compute threads (default: the driver rank's; the target waits "
                  "while the draft guesses)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--draft-kv-tokens", flags->draft_kv_tokens,
                  "draft: tokens its KV cache holds, over all the sequences it guesses for "
                  "(a sequence it has no room for gets no guesses)")
      ->capture_default_str();
}

Status ValidateSpeculativeFlags(const SpeculativeFlags& flags) {
  if (flags.tokens < 0 || flags.tokens > engine::kMaxSpecTokens) {
    return InvalidArgumentError("--spec-tokens must be in [0, " +
                                std::to_string(engine::kMaxSpecTokens) + "], got " +
                                std::to_string(flags.tokens));
  }
  if (flags.draft_kv_tokens < 16) {
    return InvalidArgumentError("--draft-kv-tokens must be >= 16, got " +
                                std::to_string(flags.draft_kv_tokens));
  }
  if (flags.ngram_max < 1) {
    return InvalidArgumentError("--spec-ngram must be >= 1, got " +
                                std::to_string(flags.ngram_max));
  }
  if (flags.proposer.empty() || flags.proposer == "ngram") return Status::Ok();
  if (flags.proposer.starts_with("draft:") && flags.proposer.size() > 6) return Status::Ok();
  return InvalidArgumentError("--speculative must be 'ngram' or 'draft:PATH', not '" +
                              flags.proposer + "'");
}

Result<std::shared_ptr<engine::Proposer>> MakeProposer(const SpeculativeFlags& flags,
                                                       const model::Tokenizer& target,
                                                       int rank_threads) {
  TESSERA_RETURN_IF_ERROR(ValidateSpeculativeFlags(flags));
  if (flags.proposer.empty()) return std::shared_ptr<engine::Proposer>();
  if (flags.proposer == "ngram") {
    return std::shared_ptr<engine::Proposer>(std::make_shared<engine::NgramProposer>(
        engine::NgramOptions{.max_ngram = flags.ngram_max}));
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::DraftProposer> draft,
      engine::DraftProposer::Create(
          flags.proposer.substr(6), target,
          {.kv_tokens = flags.draft_kv_tokens,
           .threads = flags.draft_threads > 0 ? flags.draft_threads : std::max(rank_threads, 1)}));
  return std::shared_ptr<engine::Proposer>(std::move(draft));
}

Status ApplySpeculativeFlags(const SpeculativeFlags& flags, const model::Tokenizer& target,
                             int rank_threads, engine::SchedulerOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(options.proposer, MakeProposer(flags, target, rank_threads));
  options.spec_tokens = options.proposer ? flags.tokens : 0;
  options.spec_max_batch = flags.max_batch;
  return Status::Ok();
}

std::string SpeculationSummary(const engine::SchedulerStats& stats) {
  if (stats.spec_proposer.empty()) return "";
  const double rate = stats.spec_proposed_tokens_total > 0
                          ? static_cast<double>(stats.spec_accepted_tokens_total) /
                                static_cast<double>(stats.spec_proposed_tokens_total)
                          : 0.0;
  const double per_verification = stats.spec_verifications_total > 0
                                      ? static_cast<double>(stats.spec_accepted_tokens_total) /
                                            static_cast<double>(stats.spec_verifications_total)
                                      : 0.0;
  char line[256];
  std::snprintf(line, sizeof(line),
                " | speculative %s: %lld/%lld guesses accepted (%.2f), %.2f per verification",
                stats.spec_proposer.c_str(),
                static_cast<long long>(stats.spec_accepted_tokens_total),
                static_cast<long long>(stats.spec_proposed_tokens_total), rate, per_verification);
  return line;
}

}  // namespace tessera::cli
