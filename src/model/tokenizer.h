// Tokenizer: text <-> token ids from a GGUF's tokenizer.* metadata, for the two
// vocabularies llama-family models use: SentencePiece-style "llama" (scores, byte
// fallback) and byte-level BPE "gpt2" (merges; llama-3 / qwen2 pre-tokenizers).
// Matches llama.cpp's tokenizer. Layer: model; used by generate/serve and tests.
// Immutable after construction: Encode/Decode are safe from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"

namespace tessera::model {

class StringTable;

using TokenId = int32_t;

enum class VocabKind { kSpm, kBpe };

// How a BPE vocabulary splits text into words before merging (tokenizer.ggml.pre).
enum class PreTokenizer { kNone, kGpt2, kLlama3, kQwen2 };

// Token attributes (tokenizer.ggml.token_type), numbered as GGUF numbers them.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct EncodeOptions {
  // Add BOS (and EOS) as the vocabulary's add_bos/add_eos flags say.
  bool add_special = true;
  // Recognise control tokens written in the text ("<s>", "<|im_start|>") as
  // themselves; user-defined tokens are always recognised.
  bool parse_special = false;
};

// Everything the algorithms need, as read from the GGUF (exposed for tests that
// build small vocabularies by hand).
struct VocabData {
  VocabKind kind = VocabKind::kSpm;
  PreTokenizer pre = PreTokenizer::kNone;
  std::vector<std::string> tokens;
  std::vector<float> scores;        // SPM merge priority; may be empty for BPE
  std::vector<TokenType> types;     // empty: all normal
  std::vector<std::string> merges;  // BPE: "left right", rank = index
  TokenId bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend "▁" to the text
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from `file`. InvalidArgument for missing or
  // inconsistent data (sizes of tokens/scores/types differ, unknown model, …).
  static Result<Tokenizer> FromGguf(const GgufFile& file);
  static Result<Tokenizer> FromVocab(VocabData vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<TokenId> Encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The bytes token `id` stands for (a byte token gives its byte; control tokens
  // give "" unless `render_special`). Out-of-range ids give "".
  std::string TokenPiece(TokenId id, bool render_special = false) const;
  // Concatenated pieces (possibly ending in an incomplete UTF-8 sequence).
  std::string Decode(std::span<const TokenId> ids, bool render_special = false) const;

  VocabKind kind() const;
  PreTokenizer pre_tokenizer() const;
  int64_t vocab_size() const;
  TokenId bos_id() const;
  TokenId eos_id() const;
  TokenId unk_id() const;
  bool add_bos() const;
  // True for EOS, EOT and other end-of-generation control tokens.
  bool IsEndOfGeneration(TokenId id) const;
  // The token's text as stored in the vocabulary ("▁the", "<0x0A>", "Ġthe").
  std::string_view TokenText(TokenId id) const;
  TokenType GetTokenType(TokenId id) const;
  // TokenId of exact vocabulary text, or -1.
  TokenId Find(std::string_view text) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  // Checks `vocab` (its tokens and merges empty: they come as the tables) and
  // builds the lookup structures.
  static Result<Tokenizer> Build(VocabData vocab, StringTable tokens, StringTable merges);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text that is safe to print piece by piece: an
// incomplete UTF-8 sequence at the end is held back until the bytes that complete
// it arrive. Not thread-safe (one per sequence).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Text that became complete with `id` (may be empty).
  std::string Push(TokenId id);
  // Whatever is held back, with invalid bytes replaced by U+FFFD; resets.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace tessera::model
