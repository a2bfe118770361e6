// Synthetic prompt datasets for the serve benchmark: random words, a shared prefix
// plus random words, or a mix of long and short prompts. Prompts are plain text so
// they work with any model behind any OpenAI-compatible server. Layer: bench;
// used by `tessera bench serve`. Pure functions.
//
// Length approximation: prompts are built from common lowercase English words each
// written with a leading space (" the", " city", …), which BPE and SentencePiece
// vocabularies (Llama, Qwen, Mistral, GPT) hold as single tokens, so N words
// tokenize to about N tokens (plus BOS, and the chat template on chat endpoints).
// The server's usage.prompt_tokens, when it sends usage, gives the exact count.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::bench {

enum class DatasetKind {
  kRandom,        // input_len random words (the no-sharing control of prefix caching)
  kSharedPrefix,  // num_prefixes prefixes (tenants' system prompts) of prefix_len words, each
                  // shared by its tenant's prompts (request i: tenant i % num_prefixes) +
                  // input_len random words (the question)
  kMixed,         // a long_fraction of prompts with long_input_len words, the rest input_len
  kMultiTurn,     // conversations of num_turns turns: each turn resends the conversation so
                  // far (earlier questions and the server's answers) + a new question of
                  // input_len words, sent once the previous turn has finished
};

Result<DatasetKind> ParseDatasetKind(std::string_view name);
std::string_view DatasetKindName(DatasetKind kind);

struct DatasetOptions {
  DatasetKind kind = DatasetKind::kRandom;
  int64_t num_prompts = 100;
  int64_t input_len = 1024;     // words (≈ tokens) per prompt, after any shared prefix
  int64_t output_len = 128;     // max_tokens asked for
  int64_t prefix_len = 0;       // shared-prefix: words in the common prefix
  int64_t long_input_len = 0;   // mixed: words in a long prompt (0 = 8 × input_len)
  double long_fraction = 0.25;  // mixed: share of long prompts
  int64_t num_prefixes = 1;     // shared-prefix: tenants, each with its own prefix
  // shared-prefix: the tenants' requests in a shuffled order (each tenant still gets
  // as many), not tenant i mod N — which a round-robin router over a divisor of N
  // would map to one replica per tenant by accident.
  bool shuffle_tenants = false;
  int64_t num_turns = 8;  // multi-turn: turns per conversation
  uint64_t seed = 0;
};

struct BenchRequest {
  // The whole prompt; for a later turn of a conversation, only the new question,
  // appended when sent to the previous turn's prompt and the answer it got.
  std::string prompt;
  int64_t approx_prompt_tokens = 0;  // words in the prompt (a later turn: in the new question)
  int64_t max_output_tokens = 0;
  int64_t previous_turn = -1;  // multi-turn: the index of the request this one continues
  int64_t turn = 0;            // multi-turn: 1, 2, …; 0 otherwise
};

// The word list prompts are drawn from.
std::span<const std::string_view> PromptWords();

// InvalidArgument for non-positive lengths or counts, or a shared-prefix dataset
// without a prefix. Deterministic in options.seed. Multi-turn: num_prompts /
// num_turns conversations (rounded up), turn-major (every conversation's turn 1,
// then every turn 2, …), num_prompts requests in all.
Result<std::vector<BenchRequest>> MakeDataset(const DatasetOptions& options);

}  // namespace tessera::bench
