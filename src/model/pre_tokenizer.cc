#include "model/pre_tokenizer.h"

#include <cstdint>

#include "model/unicode.h"

// The expressions reproduced here (as in llama.cpp's llama-vocab.cpp):
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2:  the llama3 expression with \p{N} instead of \p{N}{1,3}.
// Alternatives are tried in order at each position, as a backtracking regex does.

namespace tessera::model {
namespace {

enum class Class : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Cp {
  uint32_t value;   // kInvalidCodepoint for a byte that is not valid UTF-8
  uint32_t offset;  // byte offset in the text
  Class cls;
};

class Splitter {
 public:
  explicit Splitter(std::string_view text) : text_(text) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t start = pos;
      uint32_t cp = DecodeUtf8(text, &pos);
      Class cls = cp == kInvalidCodepoint ? Class::kOther
                  : IsLetter(cp)          ? Class::kLetter
                  : IsNumber(cp)          ? Class::kNumber
                  : IsWhitespace(cp)      ? Class::kSpace
                                          : Class::kOther;
      cps_.push_back({cp, static_cast<uint32_t>(start), cls});
    }
  }

  std::vector<std::string_view> Split(PreTokenizer kind) {
    std::vector<std::string_view> words;
    size_t i = 0;
    while (i < cps_.size()) {
      size_t end = kind == PreTokenizer::kGpt2 ? MatchGpt2(i) : MatchLlama3(i, kind);
      if (end <= i) end = i + 1;  // unreachable with these expressions; never loop
      size_t begin_byte = cps_[i].offset;
      size_t end_byte = end < cps_.size() ? cps_[end].offset : text_.size();
      words.push_back(text_.substr(begin_byte, end_byte - begin_byte));
      i = end;
    }
    return words;
  }

 private:
  bool Is(size_t i, Class cls) const { return i < cps_.size() && cps_[i].cls == cls; }
  uint32_t At(size_t i) const { return i < cps_.size() ? cps_[i].value : 0; }
  bool IsCrLf(size_t i) const { return At(i) == '\r' || At(i) == '\n'; }
  size_t RunOf(size_t i, Class cls) const {
    while (Is(i, cls)) ++i;
    return i;
  }
  static uint32_t Lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

  // 's 't 're 've 'm 'll 'd at i; returns the end or i.
  size_t Contraction(size_t i, bool ignore_case) const {
    if (At(i) != '\'') return i;
    auto c = [&](size_t k) { return ignore_case ? Lower(At(k)) : At(k); };
    uint32_t a = c(i + 1), b = c(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
  }

  // \s+(?!\S) then \s+ at i (i is whitespace).
  size_t TrailingSpace(size_t i) const {
    size_t end = RunOf(i, Class::kSpace);
    if (end == cps_.size()) return end;  // followed by the end: take all
    if (end - i >= 2) return end - 1;    // leave the last space to the next word
    return end;                          // \s+
  }

  size_t MatchGpt2(size_t i) const {
    if (size_t e = Contraction(i, false); e > i) return e;
    size_t j = At(i) == ' ' ? i + 1 : i;
    if (Is(j, Class::kLetter)) return RunOf(j, Class::kLetter);
    if (Is(j, Class::kNumber)) return RunOf(j, Class::kNumber);
    if (Is(j, Class::kOther)) return RunOf(j, Class::kOther);
    if (Is(i, Class::kSpace)) return TrailingSpace(i);
    return i + 1;
  }

  size_t MatchLlama3(size_t i, PreTokenizer kind) const {
    if (size_t e = Contraction(i, true); e > i) return e;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!IsCrLf(i) && !Is(i, Class::kLetter) && !Is(i, Class::kNumber) &&
        Is(i + 1, Class::kLetter)) {
      return RunOf(i + 1, Class::kLetter);
    }
    if (Is(i, Class::kLetter)) return RunOf(i, Class::kLetter);
    // \p{N}{1,3} (llama3) or \p{N} (qwen2)
    if (Is(i, Class::kNumber)) {
      size_t max = kind == PreTokenizer::kQwen2 ? 1 : 3;
      size_t e = i;
      while (e - i < max && Is(e, Class::kNumber)) ++e;
      return e;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t j = At(i) == ' ' ? i + 1 : i;
    if (Is(j, Class::kOther)) {
      size_t e = RunOf(j, Class::kOther);
      while (IsCrLf(e)) ++e;
      return e;
    }
    if (Is(i, Class::kSpace)) {
      // \s*[\r\n]+ : up to the last CR/LF of the whitespace run
      size_t end = RunOf(i, Class::kSpace);
      for (size_t k = end; k > i; --k) {
        if (IsCrLf(k - 1)) return k;
      }
      return TrailingSpace(i);
    }
    return i + 1;
  }

  std::string_view text_;
  std::vector<Cp> cps_;
};

}  // namespace

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizer kind) {
  if (text.empty()) return {};
  if (kind == PreTokenizer::kNone) return {text};
  return Splitter(text).Split(kind);
}

}  // namespace tessera::model
