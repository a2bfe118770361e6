#include "engine/proposer.h"

#include <algorithm>

#include "base/check.h"

namespace tessera::engine {

NgramProposer::NgramProposer(const NgramOptions& options) : options_(options) {
  TESSERA_CHECK(options_.min_ngram >= 1 && options_.max_ngram >= options_.min_ngram)
      << "ngram sizes " << options_.min_ngram << ".." << options_.max_ngram;
}

std::vector<int32_t> NgramProposer::Lookup(std::span<const int32_t> tokens,
                                           int32_t max_tokens) const {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min<int64_t>(options_.max_ngram, len - 1); n >= options_.min_ngram; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // The latest occurrence that starts before the suffix itself.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      // What followed, read on into the guesses themselves past the end of the
      // history: a text that repeats with period len - n - start keeps repeating.
      const int64_t from = start + n;  // < len: at least one token follows
      std::vector<int32_t> out;
      out.reserve(static_cast<size_t>(max_tokens));
      for (int64_t i = 0; i < max_tokens; ++i) {
        const int64_t at = from + i;
        out.push_back(at < len ? tokens[static_cast<size_t>(at)]
                               : out[static_cast<size_t>(at - len)]);
      }
      return out;
    }
  }
  return {};
}

Status NgramProposer::Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) {
  TESSERA_CHECK_EQ(requests.size(), out.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].tokens = Lookup(requests[i].tokens, requests[i].max_tokens);
    out[i].probs.clear();
  }
  return Status::Ok();
}

}  // namespace tessera::engine
