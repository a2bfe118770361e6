#include "model/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace tessera::model {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

Status VocabError(const std::string& what) { return InvalidArgumentError("tokenizer: " + what); }

// A token id from metadata: absent or out of range (u32 -1 means "none") -> -1.
Result<TokenId> OptionalTokenId(const GgufFile& file, std::string_view key, int64_t n_tokens,
                                TokenId fallback) {
  if (!file.Has(key)) return fallback;
  TESSERA_ASSIGN_OR_RETURN(int64_t id, file.GetInt(key));
  if (id < 0 || id >= n_tokens) return TokenId{-1};
  return static_cast<TokenId>(id);
}

Result<PreTokenizer> PreTokenizerFromName(std::string_view name) {
  if (name.empty() || name == "default" || name == "gpt2" || name == "gpt-2") {
    return PreTokenizer::kGpt2;
  }
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3" || name == "smaug-bpe") {
    return PreTokenizer::kLlama3;
  }
  if (name == "qwen2") return PreTokenizer::kQwen2;
  return VocabError("pre-tokenizer '" + std::string(name) +
                    "' is not supported (default/gpt2, llama-bpe/llama3, qwen2 are)");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::FromGguf(const GgufFile& file) {
  VocabData v;
  TESSERA_ASSIGN_OR_RETURN(std::string_view model, file.GetString("tokenizer.ggml.model"));
  if (model == "llama") {
    v.kind = VocabKind::kSpm;
  } else if (model == "gpt2") {
    v.kind = VocabKind::kBpe;
  } else {
    return VocabError("'" + file.name() + "': tokenizer.ggml.model '" + std::string(model) +
                      "' is not supported (llama, gpt2 are)");
  }
  // The pieces and merges go from the file's string arrays straight into their
  // tables: a std::string each would be the largest part of the tokenizer's heap.
  TESSERA_ASSIGN_OR_RETURN(std::span<const std::string_view> token_texts,
                           file.GetStringArray("tokenizer.ggml.tokens"));
  TESSERA_ASSIGN_OR_RETURN(StringTable tokens,
                           StringTable::Build(token_texts, StringTable::Duplicates::kLastWins));
  int64_t n = tokens.size();
  if (file.Has("tokenizer.ggml.scores")) {
    TESSERA_ASSIGN_OR_RETURN(v.scores, file.GetF32Array("tokenizer.ggml.scores"));
  }
  if (file.Has("tokenizer.ggml.token_type")) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> types,
                             file.GetI32Array("tokenizer.ggml.token_type"));
    v.types.reserve(types.size());
    for (int32_t t : types) v.types.push_back(static_cast<TokenType>(t));
  }
  StringTable merges;
  if (v.kind == VocabKind::kBpe) {
    TESSERA_ASSIGN_OR_RETURN(std::span<const std::string_view> merge_texts,
                             file.GetStringArray("tokenizer.ggml.merges"));
    TESSERA_ASSIGN_OR_RETURN(merges,
                             StringTable::Build(merge_texts, StringTable::Duplicates::kFirstWins));
    TESSERA_ASSIGN_OR_RETURN(std::string_view pre, file.GetStringOr("tokenizer.ggml.pre", ""));
    TESSERA_ASSIGN_OR_RETURN(v.pre, PreTokenizerFromName(pre));
  }
  bool spm = v.kind == VocabKind::kSpm;
  TESSERA_ASSIGN_OR_RETURN(v.bos_id,
                           OptionalTokenId(file, "tokenizer.ggml.bos_token_id", n, spm ? 1 : -1));
  TESSERA_ASSIGN_OR_RETURN(v.eos_id,
                           OptionalTokenId(file, "tokenizer.ggml.eos_token_id", n, spm ? 2 : -1));
  TESSERA_ASSIGN_OR_RETURN(
      v.unk_id, OptionalTokenId(file, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1));
  TESSERA_ASSIGN_OR_RETURN(v.pad_id,
                           OptionalTokenId(file, "tokenizer.ggml.padding_token_id", n, -1));
  TESSERA_ASSIGN_OR_RETURN(v.eot_id, OptionalTokenId(file, "tokenizer.ggml.eot_token_id", n, -1));
  bool bos_default = spm || v.pre == PreTokenizer::kLlama3;
  TESSERA_ASSIGN_OR_RETURN(v.add_bos, file.GetBoolOr("tokenizer.ggml.add_bos_token", bos_default));
  TESSERA_ASSIGN_OR_RETURN(v.add_eos, file.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  TESSERA_ASSIGN_OR_RETURN(v.add_space_prefix,
                           file.GetBoolOr("tokenizer.ggml.add_space_prefix", spm));
  return Build(std::move(v), std::move(tokens), std::move(merges));
}

Result<Tokenizer> Tokenizer::FromVocab(VocabData v) {
  TESSERA_ASSIGN_OR_RETURN(StringTable tokens,
                           StringTable::Build(v.tokens, StringTable::Duplicates::kLastWins));
  TESSERA_ASSIGN_OR_RETURN(StringTable merges,
                           StringTable::Build(v.merges, StringTable::Duplicates::kFirstWins));
  v.tokens = {};
  v.merges = {};
  return Build(std::move(v), std::move(tokens), std::move(merges));
}

Result<Tokenizer> Tokenizer::Build(VocabData v, StringTable tokens, StringTable merges) {
  const int64_t n = tokens.size();
  if (n == 0) return VocabError("the vocabulary is empty");
  if (n > (int64_t{1} << 30)) return VocabError("the vocabulary is too large");
  if (!v.scores.empty() && static_cast<int64_t>(v.scores.size()) != n) {
    return VocabError(std::to_string(v.scores.size()) + " scores for " + std::to_string(n) +
                      " tokens");
  }
  if (!v.types.empty() && static_cast<int64_t>(v.types.size()) != n) {
    return VocabError(std::to_string(v.types.size()) + " token types for " + std::to_string(n) +
                      " tokens");
  }
  for (size_t i = 0; i < v.types.size(); ++i) {
    auto t = static_cast<int32_t>(v.types[i]);
    if (t < 0 || t > static_cast<int32_t>(TokenType::kByte)) {
      return VocabError("token " + std::to_string(i) + " has unknown type " + std::to_string(t));
    }
  }
  for (TokenId* id : {&v.bos_id, &v.eos_id, &v.unk_id, &v.pad_id, &v.eot_id}) {
    if (*id >= static_cast<TokenId>(n)) *id = -1;
  }
  if (v.kind == VocabKind::kSpm) v.pre = PreTokenizer::kNone;

  auto impl = std::make_unique<Impl>();
  impl->tokens = std::move(tokens);
  if (v.kind == VocabKind::kBpe) {
    for (int64_t r = 0; r < merges.size(); ++r) {
      const std::string_view m = merges[r];
      size_t space = m.find(' ', 1);
      if (space == std::string_view::npos || space + 1 >= m.size()) {
        return VocabError("merge " + std::to_string(r) + " '" + std::string(m) +
                          "' is not 'left right'");
      }
    }
    impl->merges = std::move(merges);
    impl->ignore_merges = v.pre == PreTokenizer::kLlama3;
  }

  for (int b = 0; b < 256; ++b) {
    TokenId id = -1;
    if (v.kind == VocabKind::kSpm) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      id = impl->Lookup(hex);
      if (id < 0) id = impl->Lookup(std::string(1, static_cast<char>(b)));
    } else {
      std::string s;
      AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &s);
      id = impl->Lookup(s);
    }
    impl->byte_tokens[b] = id;
  }

  const StringTable& texts = impl->tokens;
  for (size_t i = 0; i < v.types.size(); ++i) {
    TokenType t = v.types[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !texts[static_cast<int64_t>(i)].empty()) {
      impl->special_tokens.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(impl->special_tokens.begin(), impl->special_tokens.end(),
                   [&](TokenId a, TokenId b) { return texts[a].size() > texts[b].size(); });

  for (TokenId id : {v.eos_id, v.eot_id}) {
    if (id >= 0) impl->eog_ids.push_back(id);
  }
  for (std::string_view text : {"<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>",
                                "<end_of_turn>", "<|end|>", "<|eom_id|>"}) {
    TokenId id = impl->Lookup(text);
    if (id >= 0 && (v.types.empty() || v.types[id] == TokenType::kControl) &&
        std::find(impl->eog_ids.begin(), impl->eog_ids.end(), id) == impl->eog_ids.end()) {
      impl->eog_ids.push_back(id);
    }
  }
  impl->vocab = std::move(v);
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& impl = *impl_;
  const VocabData& v = impl.vocab;

  // Split out special tokens: longest first, each over the plain-text fragments.
  struct Fragment {
    std::string_view text;  // plain text when token < 0
    TokenId token;
  };
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text, -1});
  for (TokenId special : impl.special_tokens) {
    TokenType type = impl.TypeOf(special);
    if (!options.parse_special && type != TokenType::kUserDefined) continue;
    const std::string_view needle = impl.tokens[special];
    std::vector<Fragment> next;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t start = 0;
      for (size_t hit; (hit = f.text.find(needle, start)) != std::string_view::npos;
           start = hit + needle.size()) {
        if (hit > start) next.push_back({f.text.substr(start, hit - start), -1});
        next.push_back({{}, special});
      }
      if (start < f.text.size()) next.push_back({f.text.substr(start), -1});
    }
    fragments = std::move(next);
  }

  std::vector<TokenId> out;
  if (options.add_special && v.add_bos && v.bos_id >= 0) out.push_back(v.bos_id);
  bool prev_special = true;  // SPM: the first fragment gets the space prefix
  std::string escaped;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (v.kind == VocabKind::kSpm) {
      escaped.clear();
      if (v.add_space_prefix && prev_special) escaped += kSpmSpace;
      for (char c : f.text) {
        if (c == ' ') {
          escaped += kSpmSpace;
        } else {
          escaped += c;
        }
      }
      impl.EncodeSpm(escaped, &out);
    } else {
      impl.EncodeBpe(f.text, &out);
    }
    prev_special = false;
  }
  if (options.add_special && v.add_eos && v.eos_id >= 0) out.push_back(v.eos_id);
  return out;
}

std::string Tokenizer::TokenPiece(TokenId id, bool render_special) const {
  const Impl& impl = *impl_;
  const VocabData& v = impl.vocab;
  if (id < 0 || id >= impl.tokens.size()) return "";
  const std::string_view text = impl.tokens[id];
  switch (impl.TypeOf(id)) {
    case TokenType::kControl:
      return render_special ? std::string(text) : "";
    case TokenType::kUnknown:
      return render_special ? std::string(text)
                            : "\xE2\x96\x85";  // U+2585, as llama.cpp prints <unk>
    case TokenType::kUserDefined:
      return std::string(text);
    case TokenType::kUnused:
      return render_special ? std::string(text) : "";
    case TokenType::kByte:
      if (v.kind == VocabKind::kSpm && text.size() == 6 && text.starts_with("<0x")) {
        unsigned byte = 0;
        const std::string hex(text.substr(3, 2));
        if (std::sscanf(hex.c_str(), "%2X", &byte) == 1) {
          return std::string(1, static_cast<char>(byte));
        }
      }
      break;  // decode like a normal token
    case TokenType::kNormal:
    case TokenType::kUndefined:
      break;
  }
  std::string out;
  if (v.kind == VocabKind::kSpm) {
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += text[i++];
      }
    }
    return out;
  }
  for (size_t pos = 0; pos < text.size();) {
    size_t start = pos;
    uint32_t cp = DecodeUtf8(text, &pos);
    int byte = cp == kInvalidCodepoint ? -1 : CodepointToByte(cp);
    if (byte >= 0) {
      out += static_cast<char>(byte);
    } else {
      out.append(text.substr(start, pos - start));  // not a byte-level character: keep as is
    }
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out += TokenPiece(id, render_special);
  return out;
}

VocabKind Tokenizer::kind() const { return impl_->vocab.kind; }
PreTokenizer Tokenizer::pre_tokenizer() const { return impl_->vocab.pre; }
int64_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
TokenId Tokenizer::bos_id() const { return impl_->vocab.bos_id; }
TokenId Tokenizer::eos_id() const { return impl_->vocab.eos_id; }
TokenId Tokenizer::unk_id() const { return impl_->vocab.unk_id; }
bool Tokenizer::add_bos() const { return impl_->vocab.add_bos; }

bool Tokenizer::IsEndOfGeneration(TokenId id) const {
  return id >= 0 &&
         std::find(impl_->eog_ids.begin(), impl_->eog_ids.end(), id) != impl_->eog_ids.end();
}

std::string_view Tokenizer::TokenText(TokenId id) const {
  if (id < 0 || id >= impl_->tokens.size()) return {};
  return impl_->tokens[id];
}

TokenType Tokenizer::GetTokenType(TokenId id) const {
  if (id < 0 || id >= impl_->tokens.size()) {
    return TokenType::kUndefined;
  }
  return impl_->TypeOf(id);
}

TokenId Tokenizer::Find(std::string_view text) const { return impl_->Lookup(text); }

// ---------------------------------------------------------------- IncrementalDecoder

std::string IncrementalDecoder::Push(TokenId id) {
  pending_ += tokenizer_->TokenPiece(id);
  size_t hold = IncompleteUtf8Suffix(pending_);
  std::string ready = SanitizeUtf8(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string IncrementalDecoder::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace tessera::model
