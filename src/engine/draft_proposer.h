// DraftProposer: speculative guesses from a small draft model with the target's
// vocabulary (any GGUF the engine loads: e.g. a Q4_0 sibling of the target). It
// runs on the driver rank by the same engine (its own StageRunner over one rank,
// its own small KV cache and thread pool), whatever the target's TP/PP layout.
// Each round it brings every speculating sequence's draft KV up to the target's
// tokens (rolling back past the first token they disagree on: the guesses the
// target rejected), then decodes k tokens for all of them in batched steps:
// greedily for a greedy sequence; for a sampling one, drawn as it samples (the
// request's temperature, filters and penalties, a seed from its seed and the
// position) with each guess's distribution q returned, so the rejection rule keeps
// a guess with probability min(1, p/q) — near 1 for a draft close to the target,
// where an argmax guess would be kept only with probability p. A sequence whose
// draft KV does not fit gets no guesses this round. Layer: engine. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/driver.h"
#include "engine/loaded_model.h"
#include "engine/proposer.h"
#include "engine/stage_runner.h"
#include "kv/block_allocator.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"
#include "model/tokenizer.h"

namespace tessera::engine {

// OK when `draft` has the target's vocabulary: the same size, the same text for
// every token, the same BOS and EOS ids; else InvalidArgument naming the first
// difference.
Status CheckSameVocabulary(const model::Tokenizer& target, const model::Tokenizer& draft);

struct DraftOptions {
  int64_t kv_tokens = 8192;  // the draft's KV cache, shared by all sequences
  int threads = 1;
};

class DraftProposer final : public Proposer {
 public:
  // Loads the draft at `path` and checks its vocabulary against the target's.
  static Result<std::unique_ptr<DraftProposer>> Create(const std::string& path,
                                                       const model::Tokenizer& target,
                                                       const DraftOptions& options = {});
  ~DraftProposer() override;

  std::string name() const override { return "draft"; }
  Status Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) override;
  void Forget(int64_t sequence_id) override;

 private:
  struct DraftSequence {
    explicit DraftSequence(int32_t block_size) : table(block_size) {}
    kv::BlockTable table;
    std::vector<int32_t> cached;  // tokens whose K/V the draft holds, in order
  };

  DraftProposer(LoadedModel loaded, const DraftOptions& options);

  LoadedModel loaded_;
  ThreadPool pool_;
  std::unique_ptr<kv::KvCache> cache_;
  std::unique_ptr<kv::BlockAllocator> allocator_;
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<Driver> driver_;
  std::map<int64_t, DraftSequence> sequences_;
};

}  // namespace tessera::engine
