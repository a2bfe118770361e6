#include "bench/dataset.h"

#include <algorithm>
#include <iterator>
#include <random>

namespace tessera::bench {
namespace {

// Frequent English words, each a single token (with its leading space) in common
// LLM vocabularies.
constexpr std::string_view kWords[] = {
    "the",    "of",    "and",        "to",      "in",     "is",       "was",     "for",    "on",
    "that",   "with",  "as",         "by",      "at",     "from",     "his",     "it",     "an",
    "were",   "are",   "which",      "this",    "be",     "or",       "has",     "had",    "not",
    "but",    "also",  "first",      "their",   "one",    "its",      "new",     "after",  "who",
    "they",   "her",   "she",        "two",     "been",   "other",    "when",    "there",  "all",
    "during", "into",  "school",     "time",    "may",    "years",    "more",    "most",   "only",
    "over",   "city",  "some",       "world",   "would",  "where",    "later",   "up",     "such",
    "used",   "many",  "can",        "state",   "about",  "national", "out",     "known",  "made",
    "then",   "year",  "between",    "both",    "these",  "war",      "him",     "under",  "three",
    "team",   "film",  "while",      "part",    "season", "being",    "through", "each",   "game",
    "before", "than",  "found",      "well",    "became", "second",   "since",   "same",   "area",
    "house",  "work",  "music",      "south",   "north",  "life",     "number",  "early",  "family",
    "played", "high",  "government", "several", "could",  "old",      "back",    "group",  "county",
    "name",   "did",   "however",    "great",   "around", "will",     "band",    "series", "four",
    "them",   "day",   "use",        "system",  "way",    "long",     "best",    "book",   "river",
    "water",  "power", "church",     "line",    "small",  "west",     "east",    "end",    "home",
    "public", "album", "club",       "field",   "road",   "land",     "light",   "point",  "order",
    "black",  "white", "green",      "story",   "party",  "place",    "local",   "major",
};

std::string RandomWords(int64_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string out;
  out.reserve(static_cast<size_t>(n) * 7);
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(' ');
    out.append(kWords[pick(rng)]);
  }
  return out;
}

// Turn-major conversations: request c + t * C is turn t + 1 of conversation c.
std::vector<BenchRequest> MakeMultiTurn(const DatasetOptions& options, std::mt19937_64& rng) {
  const int64_t num_conversations =
      (options.num_prompts + options.num_turns - 1) / options.num_turns;
  std::vector<BenchRequest> out;
  out.reserve(static_cast<size_t>(options.num_prompts));
  for (int64_t i = 0; i < options.num_prompts; ++i) {
    BenchRequest req;
    req.turn = i / num_conversations + 1;
    req.previous_turn = req.turn > 1 ? i - num_conversations : -1;
    req.prompt = RandomWords(options.input_len, rng);
    if (req.turn == 1) req.prompt.erase(0, 1);  // no leading space on the first word
    req.approx_prompt_tokens = options.input_len;
    req.max_output_tokens = options.output_len;
    out.push_back(std::move(req));
  }
  return out;
}

}  // namespace

std::span<const std::string_view> PromptWords() { return kWords; }

Result<DatasetKind> ParseDatasetKind(std::string_view name) {
  if (name == "random") return DatasetKind::kRandom;
  if (name == "shared-prefix") return DatasetKind::kSharedPrefix;
  if (name == "mixed") return DatasetKind::kMixed;
  if (name == "multi-turn") return DatasetKind::kMultiTurn;
  return InvalidArgumentError(
      "--dataset must be random, shared-prefix, mixed or multi-turn, not '" + std::string(name) +
      "'");
}

std::string_view DatasetKindName(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::kRandom:
      return "random";
    case DatasetKind::kSharedPrefix:
      return "shared-prefix";
    case DatasetKind::kMixed:
      return "mixed";
    case DatasetKind::kMultiTurn:
      return "multi-turn";
  }
  return "?";
}

Result<std::vector<BenchRequest>> MakeDataset(const DatasetOptions& options) {
  if (options.num_prompts < 1) return InvalidArgumentError("--num-prompts must be >= 1");
  if (options.input_len < 1) return InvalidArgumentError("--input-len must be >= 1");
  if (options.output_len < 1) return InvalidArgumentError("--output-len must be >= 1");
  if (options.prefix_len < 0) return InvalidArgumentError("--prefix-len must be >= 0");
  if (options.kind == DatasetKind::kSharedPrefix && options.prefix_len == 0) {
    return InvalidArgumentError("--dataset shared-prefix needs --prefix-len > 0");
  }
  if (options.long_input_len < 0) return InvalidArgumentError("--long-input-len must be >= 0");
  if (options.long_fraction < 0 || options.long_fraction > 1) {
    return InvalidArgumentError("--long-fraction must be in [0, 1]");
  }
  if (options.num_prefixes < 1) return InvalidArgumentError("--num-prefixes must be >= 1");
  if (options.num_turns < 1) return InvalidArgumentError("--num-turns must be >= 1");
  std::mt19937_64 rng(options.seed);
  if (options.kind == DatasetKind::kMultiTurn) return MakeMultiTurn(options, rng);
  std::vector<std::string> prefixes(1);
  int64_t prefix_words = 0;
  if (options.kind == DatasetKind::kSharedPrefix) {
    prefixes.clear();
    for (int64_t t = 0; t < options.num_prefixes; ++t) {
      prefixes.push_back(RandomWords(options.prefix_len, rng));
    }
    prefix_words = options.prefix_len;
  }
  const int64_t long_len =
      options.long_input_len > 0 ? options.long_input_len : 8 * options.input_len;
  // Exactly round(long_fraction × n) long prompts, at shuffled positions.
  std::vector<bool> is_long(static_cast<size_t>(options.num_prompts), false);
  if (options.kind == DatasetKind::kMixed) {
    const auto num_long = static_cast<size_t>(
        std::llround(options.long_fraction * static_cast<double>(options.num_prompts)));
    std::fill(is_long.begin(), is_long.begin() + static_cast<ptrdiff_t>(num_long), true);
    std::shuffle(is_long.begin(), is_long.end(), rng);
  }
  std::vector<size_t> tenant(is_long.size());
  for (size_t i = 0; i < tenant.size(); ++i) tenant[i] = i % prefixes.size();
  if (options.shuffle_tenants) std::shuffle(tenant.begin(), tenant.end(), rng);
  std::vector<BenchRequest> out;
  out.reserve(is_long.size());
  for (size_t i = 0; i < is_long.size(); ++i) {
    const int64_t words = is_long[i] ? long_len : options.input_len;
    BenchRequest req;
    req.prompt = prefixes[tenant[i]] + RandomWords(words, rng);
    req.prompt.erase(0, 1);  // no leading space on the first word
    req.approx_prompt_tokens = prefix_words + words;
    req.max_output_tokens = options.output_len;
    out.push_back(std::move(req));
  }
  return out;
}

}  // namespace tessera::bench
