// UTF-8 decoding/encoding and the few Unicode character classes the tokenizers
// need (\p{L}, \p{N}, \s as llama.cpp defines them). Layer: model (tokenizer
// internals). Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::model {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence that starts with `lead` judged by that byte alone
// (1 for ASCII and for stray continuation bytes), as llama.cpp's SPM splitter does.
size_t Utf8SequenceLength(uint8_t lead);

// Decodes the code point at text[*pos] and advances *pos. An invalid or truncated
// sequence consumes one byte and returns nullopt-like kInvalidCodepoint.
inline constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFF;
uint32_t DecodeUtf8(std::string_view text, size_t* pos);

void AppendUtf8(uint32_t cp, std::string* out);

// Number of bytes at the end of `text` that form the start of a valid but
// incomplete UTF-8 sequence (0..3): what a streaming decoder must hold back.
size_t IncompleteUtf8Suffix(std::string_view text);

// `text` with each invalid byte replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view text);

bool IsLetter(uint32_t cp);      // general category L*
bool IsNumber(uint32_t cp);      // general category N*
bool IsWhitespace(uint32_t cp);  // \t\n\v\f\r, space, U+0085, U+00A0, Zs/Zl/Zp

namespace internal {
struct CodepointRange {
  uint32_t first, last;
};
extern const CodepointRange kLetterRanges[];
extern const size_t kLetterRangesSize;
extern const CodepointRange kNumberRanges[];
extern const size_t kNumberRangesSize;
}  // namespace internal

}  // namespace tessera::model
