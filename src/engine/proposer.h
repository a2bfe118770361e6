// Proposer: guesses the next tokens of sequences for speculative decoding; the
// scheduler verifies the guesses with the target model in one step and keeps the
// longest agreeing prefix plus the target's own next token. Kinds: prompt lookup
// (NgramProposer, here: no model), a draft model (draft_proposer.h); a head that
// reads the target's hidden states (EAGLE/MTP) would be a third, given them
// through ProposalRequest. Layer: engine; the scheduler owns the calls. Not
// thread-safe: the scheduler thread calls it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/sampler.h"

namespace tessera::engine {

// One sequence that wants a proposal.
struct ProposalRequest {
  int64_t sequence_id = 0;
  // Prompt and generated tokens so far; the last one is the token the target
  // computes next (its K/V is not cached yet), the proposal continues it.
  std::span<const int32_t> tokens;
  int32_t max_tokens = 0;  // propose at most this many (>= 1)
  // How the sequence samples (null: greedy). A proposer that can may sample its
  // guesses the same way and return the distributions (Proposal::probs): with a
  // draft close to the target, sampled guesses are then kept as often as greedy
  // ones, where a deterministic guess is kept only with the target's probability.
  const model::SamplingParams* sampling = nullptr;
  int64_t num_prompt_tokens = 0;  // of `tokens` (for the sampling penalties)
};

struct Proposal {
  std::vector<int32_t> tokens;  // at most max_tokens; empty: no guess
  // For a proposer that samples its guesses: the [tokens.size(), vocab]
  // probabilities q each was drawn from (the rejection rule needs them). Empty for
  // a deterministic proposer (q is one-hot at the guess).
  std::vector<float> probs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // "ngram", "draft".
  virtual std::string name() const = 0;
  // Proposals for every speculating sequence of a step at once (a draft model
  // runs them as one batch); out.size() == requests.size().
  virtual Status Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) = 0;
  // The sequence is finished: drop whatever was kept for it.
  virtual void Forget(int64_t /*sequence_id*/) {}
};

struct NgramOptions {
  int32_t max_ngram = 4;  // match the last n tokens, n from max_ngram down to min_ngram
  int32_t min_ngram = 1;
};

// Prompt lookup: finds the latest earlier occurrence of the sequence's last n
// tokens (n from max_ngram down to min_ngram: the longest match wins) in its
// prompt and output so far and proposes the tokens that followed it (reading on
// into its own guesses when they reach the end: a loop keeps looping). Costs no
// model step; on text that repeats (code edits, quoting, summaries of the
// prompt) most guesses are right, on text that does not there is mostly no match
// and so no proposal.
class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(const NgramOptions& options = {});
  std::string name() const override { return "ngram"; }
  Status Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) override;

  // The proposal for one token history (what Propose does per request).
  std::vector<int32_t> Lookup(std::span<const int32_t> tokens, int32_t max_tokens) const;

 private:
  NgramOptions options_;
};

}  // namespace tessera::engine
