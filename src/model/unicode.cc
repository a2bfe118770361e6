#include "model/unicode.h"

#include <algorithm>

namespace tessera::model {

size_t Utf8SequenceLength(uint8_t lead) {
  if (lead < 0xC0) return 1;  // ASCII or a stray continuation byte
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

uint32_t DecodeUtf8(std::string_view text, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + *pos;
  size_t left = text.size() - *pos;
  uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  size_t len = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    *pos += 1;
    return kInvalidCodepoint;
  }
  if (left < len) {
    *pos += 1;
    return kInvalidCodepoint;
  }
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) {
      *pos += 1;
      return kInvalidCodepoint;
    }
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *pos += 1;
    return kInvalidCodepoint;
  }
  *pos += len;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t IncompleteUtf8Suffix(std::string_view text) {
  // Find the last lead byte among the final (at most 3) bytes; it is pending when
  // its sequence needs more bytes than remain and what is there is a valid prefix.
  size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    auto lead = static_cast<uint8_t>(text[n - back]);
    if ((lead & 0xC0) == 0x80) continue;             // continuation byte
    if (lead < 0xC2 || lead > 0xF4) return 0;        // ASCII or never a valid lead
    if (Utf8SequenceLength(lead) <= back) return 0;  // complete (or overlong junk)
    if (back >= 2) {                                 // second-byte constraints
      auto second = static_cast<uint8_t>(text[n - back + 1]);
      if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F) ||
          (lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) {
        return 0;
      }
    }
    return back;
  }
  return 0;
}

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    uint32_t cp = DecodeUtf8(text, &pos);
    if (cp == kInvalidCodepoint) {
      AppendUtf8(kReplacementChar, &out);
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

namespace {
bool InRanges(const internal::CodepointRange* ranges, size_t size, uint32_t cp) {
  const internal::CodepointRange* end = ranges + size;
  const internal::CodepointRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t c, const internal::CodepointRange& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}
}  // namespace

bool IsLetter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(internal::kLetterRanges, internal::kLetterRangesSize, cp);
}

bool IsNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(internal::kNumberRanges, internal::kNumberRangesSize, cp);
}

bool IsWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace tessera::model
