#include "engine/draft_proposer.h"

#include <algorithm>
#include <optional>

#include "base/check.h"
#include "kernels/ops.h"

namespace tessera::engine {

Status CheckSameVocabulary(const model::Tokenizer& target, const model::Tokenizer& draft) {
  if (target.vocab_size() != draft.vocab_size()) {
    return InvalidArgumentError("the draft's vocabulary has " + std::to_string(draft.vocab_size()) +
                                " tokens, the target's " + std::to_string(target.vocab_size()));
  }
  for (int64_t id = 0; id < target.vocab_size(); ++id) {
    const auto t = static_cast<model::TokenId>(id);
    if (target.TokenText(t) != draft.TokenText(t)) {
      return InvalidArgumentError("token " + std::to_string(id) + " is \"" +
                                  std::string(draft.TokenText(t)) + "\" in the draft, \"" +
                                  std::string(target.TokenText(t)) + "\" in the target");
    }
  }
  if (target.bos_id() != draft.bos_id() || target.eos_id() != draft.eos_id()) {
    return InvalidArgumentError("the draft's BOS/EOS ids are " + std::to_string(draft.bos_id()) +
                                "/" + std::to_string(draft.eos_id()) + ", the target's " +
                                std::to_string(target.bos_id()) + "/" +
                                std::to_string(target.eos_id()));
  }
  return Status::Ok();
}

Result<std::unique_ptr<DraftProposer>> DraftProposer::Create(const std::string& path,
                                                             const model::Tokenizer& target,
                                                             const DraftOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(path));
  if (Status same = CheckSameVocabulary(target, *loaded.tokenizer); !same.ok()) {
    return InvalidArgumentError("draft model " + path +
                                " does not share the target's vocabulary: " + same.message());
  }
  std::unique_ptr<DraftProposer> proposer(new DraftProposer(std::move(loaded), options));
  RuntimeOptions runtime;
  TESSERA_ASSIGN_OR_RETURN(kv::KvCache cache,
                           CreateKvCache(*proposer->loaded_.model, runtime.kv_type,
                                         runtime.block_size, options.kv_tokens));
  proposer->cache_ = std::make_unique<kv::KvCache>(std::move(cache));
  proposer->allocator_ = std::make_unique<kv::BlockAllocator>(proposer->cache_->num_blocks());
  runtime.kv_capacity_tokens = options.kv_tokens;
  TESSERA_ASSIGN_OR_RETURN(proposer->runner_,
                           StageRunner::CreateLocal(*proposer->loaded_.model, *proposer->cache_,
                                                    proposer->pool_, runtime));
  proposer->driver_ = std::make_unique<Driver>(*proposer->runner_);
  return proposer;
}

DraftProposer::DraftProposer(LoadedModel loaded, const DraftOptions& options)
    : loaded_(std::move(loaded)), pool_(std::max(options.threads, 1)) {}

DraftProposer::~DraftProposer() {
  for (auto& [id, s] : sequences_) s.table.Release(*allocator_);
}

void DraftProposer::Forget(int64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return;
  it->second.table.Release(*allocator_);
  sequences_.erase(it);
}

Status DraftProposer::Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) {
  TESSERA_CHECK_EQ(requests.size(), out.size());
  const int32_t block_size = cache_->shape().block_size;
  // The sequences that take part: their draft KV rolled back to the longest
  // prefix it shares with the target's tokens, then room for the rest and the
  // guesses fed back (all but the last).
  std::vector<size_t> active;
  std::vector<std::vector<int32_t>> feed(requests.size());  // this round's new tokens
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].tokens.clear();
    out[i].probs.clear();
    const ProposalRequest& r = requests[i];
    const int64_t len = static_cast<int64_t>(r.tokens.size());
    auto [it, inserted] = sequences_.try_emplace(r.sequence_id, block_size);
    DraftSequence& s = it->second;
    const auto mismatch =
        std::mismatch(s.cached.begin(), s.cached.end(), r.tokens.begin(), r.tokens.end());
    // At least the last token is fed: its logits give the first guess.
    const int64_t keep =
        std::min<int64_t>(static_cast<int64_t>(mismatch.first - s.cached.begin()), len - 1);
    s.cached.resize(static_cast<size_t>(keep));
    s.table.Truncate(*allocator_, keep);
    if (!s.table.Reserve(*allocator_, len + r.max_tokens - 1).ok()) {
      Forget(r.sequence_id);  // no room in the draft's cache: no guesses, start afresh later
      continue;
    }
    feed[i].assign(r.tokens.begin() + keep, r.tokens.end());
    active.push_back(i);
  }
  // Decode up to max_tokens guesses for every active sequence, one batched step a
  // guess: greedy, or drawn as the sequence samples (its distribution q kept for
  // the rejection rule) by a sampler seeded from the request's seed and the
  // position, so a seeded request guesses, and so ends, the same every run.
  std::vector<StepEntry> entries;
  const size_t vocab = static_cast<size_t>(driver_->vocab_size());
  std::vector<std::optional<model::Sampler>> samplers(requests.size());
  std::vector<std::vector<int32_t>> histories(requests.size());
  for (size_t i : active) {
    const model::SamplingParams* sampling = requests[i].sampling;
    if (sampling == nullptr || sampling->temperature <= 0) continue;
    model::SamplingParams params = *sampling;
    params.seed = sampling->seed ^ (0x9e3779b97f4a7c15ull * (requests[i].tokens.size() + 1));
    samplers[i].emplace(params);
    histories[i].assign(requests[i].tokens.begin(), requests[i].tokens.end());
  }
  for (int32_t g = 0; !active.empty(); ++g) {
    entries.clear();
    for (size_t i : active) {
      DraftSequence& s = sequences_.at(requests[i].sequence_id);
      entries.push_back({.new_tokens = feed[i],
                         .start_position = static_cast<int64_t>(s.cached.size()),
                         .block_table = &s.table});
    }
    TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, driver_->Step(entries));
    std::vector<size_t> next;
    for (size_t e = 0; e < active.size(); ++e) {
      const size_t i = active[e];
      DraftSequence& s = sequences_.at(requests[i].sequence_id);
      s.cached.insert(s.cached.end(), feed[i].begin(), feed[i].end());
      const std::span<const float> row = logits.subspan(e * vocab, vocab);
      int32_t guess = 0;
      if (samplers[i]) {
        out[i].probs.resize(out[i].probs.size() + vocab);
        guess = samplers[i]->SampleWithDistribution(
            row, histories[i], static_cast<size_t>(requests[i].num_prompt_tokens),
            std::span<float>(out[i].probs).last(vocab));
        histories[i].push_back(guess);
      } else {
        guess = static_cast<int32_t>(kernels::Argmax(row));
      }
      out[i].tokens.push_back(guess);
      feed[i].assign(1, guess);
      if (static_cast<int32_t>(out[i].tokens.size()) < requests[i].max_tokens) next.push_back(i);
    }
    active = std::move(next);
  }
  return Status::Ok();
}

}  // namespace tessera::engine
