// Tokenizer internals shared by tokenizer.cc (vocabulary, special tokens,
// decoding), tokenizer_spm.cc and tokenizer_bpe.cc. Layer: model; private to the
// tokenizer files.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace tessera::model {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TextToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  VocabData vocab;
  TextToId token_to_id;
  TextToId merge_rank;                  // BPE: "left right" -> rank
  std::vector<TokenId> special_tokens;  // control/user-defined/unknown, longest text first
  std::vector<TokenId> eog_ids;
  std::array<TokenId, 256> byte_tokens{};  // token for each raw byte (-1: none)
  bool ignore_merges = false;              // BPE llama3: whole-word tokens win

  TokenId Lookup(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
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
