// Tokenizer internals shared by tokenizer.cc (vocabulary, special tokens,
// decoding), tokenizer_spm.cc and tokenizer_bpe.cc. Layer: model; private to the
// tokenizer files.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "model/string_table.h"
#include "model/tokenizer.h"

namespace tessera::model {

struct Tokenizer::Impl {
  VocabData vocab;                      // all but its tokens and merges, which are the two tables:
  StringTable tokens;                   // id -> text; Find: the last id of a text
  StringTable merges;                   // BPE: rank -> "left right"; Find: the first rank of a pair
  std::vector<TokenId> special_tokens;  // control/user-defined/unknown, longest text first
  std::vector<TokenId> eog_ids;
  std::array<TokenId, 256> byte_tokens{};  // token for each raw byte (-1: none)
  bool ignore_merges = false;              // BPE llama3: whole-word tokens win

  TokenId Lookup(std::string_view text) const { return tokens.Find(text); }
  TokenType TypeOf(TokenId id) const {
    return vocab.types.empty() ? TokenType::kNormal : vocab.types[id];
  }

  // One fragment of plain text (no special tokens), appended to `out`.
  void EncodeSpm(std::string_view text, std::vector<TokenId>* out) const;
  void EncodeBpe(std::string_view text, std::vector<TokenId>* out) const;
};

// GPT-2's reversible byte <-> printable code point map used by byte-level BPE.
uint32_t ByteToCodepoint(uint8_t byte);
int CodepointToByte(uint32_t cp);  // -1 when cp is not in the map

}  // namespace tessera::model
