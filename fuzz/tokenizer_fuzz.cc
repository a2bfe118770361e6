// libFuzzer target for the tokenizers on arbitrary text — a prompt is whatever a
// client sends, invalid UTF-8 included — and arbitrary token ids. It checks
// properties, not only the absence of crashes; a violation traps:
//  - every id Encode returns is in the vocabulary;
//  - text comes back from its ids: byte-level BPE gives back every byte string;
//    SentencePiece (byte fallback) gives back the text with its space prefix and
//    each "▁" as a space (it escapes spaces as "▁");
//  - IncrementalDecoder's pieces are valid UTF-8 and add up to the whole decode,
//    invalid bytes replaced (what a stream prints is what a one-shot reply holds),
//    for the encoded ids and for ids read from the input, out of range included.
// Input: byte 0 picks the vocabulary and the encode options, the rest is the text.
// Vocabularies: byte-level BPE with the GPT-2, llama-3 and qwen2 pre-tokenizers and
// a SentencePiece one, built here, plus llama.cpp's SentencePiece test vocabulary
// from shared/models when it is there. Corpus: fuzz/corpus/tokenizer.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"  // ByteToCodepoint
#include "model/unicode.h"

namespace tessera::model {
namespace {

constexpr std::string_view kUserToken = "<tool>";  // user-defined: split even as plain text
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// GPT-2's byte-to-character map, as the tokenizer has it.
std::string ByteChar(uint8_t b) {
  std::string out;
  AppendUtf8(ByteToCodepoint(b), &out);
  return out;
}

Tokenizer MustBuild(VocabData vocab) {
  Result<Tokenizer> tokenizer = Tokenizer::FromVocab(std::move(vocab));
  Check(tokenizer.ok());
  return std::move(tokenizer).value();
}

Tokenizer Bpe(PreTokenizer pre) {
  VocabData v;
  v.kind = VocabKind::kBpe;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(static_cast<uint8_t>(b)));
  const std::string G = ByteChar(' ');  // "Ġ"
  v.merges = {"l l", "e ll",       "h ell", "hell o", G + " w", "o r",     G + "w or",
              "l d", G + "wor ld", "1 2",   "12 3",   G + " t", G + "t h", "Ã ©"};
  const std::string pieces[] = {"ll", "ell",       "hell", "hello", G + "w", "or",     G + "wor",
                                "ld", G + "world", "12",   "123",   G + "t", G + "th", "Ã©"};
  for (const std::string& t : pieces) v.tokens.push_back(t);
  v.tokens.push_back("<|end|>");
  v.tokens.push_back(std::string(kUserToken));
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types[v.tokens.size() - 2] = TokenType::kControl;
  v.types.back() = TokenType::kUserDefined;
  v.eos_id = static_cast<TokenId>(v.tokens.size() - 2);
  v.bos_id = v.eos_id;
  v.add_bos = true;
  return MustBuild(std::move(v));
}

Tokenizer Spm() {
  VocabData v;
  v.kind = VocabKind::kSpm;
  v.add_space_prefix = true;
  v.add_bos = true;
  const auto add = [&](std::string text, TokenType type, float score) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
    v.scores.push_back(score);
  };
  add("<unk>", TokenType::kUnknown, 0);
  add("<s>", TokenType::kControl, 0);
  add("</s>", TokenType::kControl, 0);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, TokenType::kByte, 0);
  }
  const std::string S(kSpmSpace);
  const std::string pieces[] = {S,        S + "t", "he",          S + "the",  "ll",
                                S + "he", "llo",   S + "hello",   "\xC3\xA9", "\xF0\x9F\xA6\x99",
                                S + S,    "12",    S + "\xC3\xA9"};
  float score = -1;
  for (const std::string& t : pieces) add(t, TokenType::kNormal, score--);
  add(std::string(kUserToken), TokenType::kUserDefined, 0);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  return MustBuild(std::move(v));
}

struct Vocabularies {
  std::vector<Tokenizer> all;
  Vocabularies() {
    all.push_back(Bpe(PreTokenizer::kGpt2));
    all.push_back(Bpe(PreTokenizer::kLlama3));
    all.push_back(Bpe(PreTokenizer::kQwen2));
    all.push_back(Spm());
    Result<GgufFile> file =
        GgufFile::Open(std::string(TESSERA_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
    if (file.ok()) {
      Result<Tokenizer> real = Tokenizer::FromGguf(*file);
      Check(real.ok());
      all.push_back(std::move(real).value());
    }
  }
};

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size()) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Streams `ids` through an IncrementalDecoder: valid UTF-8 pieces whose sum is the
// whole decode with invalid bytes replaced.
void CheckStreamedDecode(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  IncrementalDecoder decoder(tokenizer);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string piece = decoder.Push(id);
    Check(SanitizeUtf8(piece) == piece);
    streamed += piece;
  }
  const std::string rest = decoder.Flush();
  Check(SanitizeUtf8(rest) == rest);
  streamed += rest;
  Check(streamed == SanitizeUtf8(tokenizer.Decode(ids)));
}

}  // namespace
}  // namespace tessera::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::model;
  static const Vocabularies vocabularies;
  if (size == 0) return 0;
  const Tokenizer& tokenizer = vocabularies.all[data[0] % vocabularies.all.size()];
  const EncodeOptions options{.add_special = (data[0] & 0x40) != 0,
                              .parse_special = (data[0] & 0x80) != 0};
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<TokenId> ids = tokenizer.Encode(text, options);
  for (TokenId id : ids) Check(id >= 0 && id < tokenizer.vocab_size());
  if (!options.parse_special) {
    const std::string decoded = tokenizer.Decode(ids);
    if (tokenizer.kind() == VocabKind::kBpe) {
      Check(decoded == text);
    } else if (text.find(kUserToken) == std::string_view::npos) {
      // One fragment: the space prefix, then every "▁" (escaped or typed) a space.
      // Where invalid UTF-8 precedes an escaped space, a lead byte's symbol swallows
      // part of its "▁" (as in llama.cpp), and those bytes come back as byte tokens,
      // raw: compare with the decode's own "▁" as spaces too.
      const std::string expected =
          ReplaceAll(text.empty() ? "" : " " + std::string(text), kSpmSpace, " ");
      if (SanitizeUtf8(text) == text) {
        Check(decoded == expected);
      } else {
        Check(ReplaceAll(decoded, kSpmSpace, " ") == expected);
      }
    }
  }
  CheckStreamedDecode(tokenizer, ids);

  // The input read as token ids (4 bytes each), any value.
  std::vector<TokenId> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (TokenId& id : raw) {
    if (id >= 0) id %= static_cast<TokenId>(tokenizer.vocab_size() + 8);
  }
  CheckStreamedDecode(tokenizer, raw);
  return 0;
}
