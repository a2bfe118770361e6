#include "model/string_table.h"

#include <algorithm>
#include <bit>
#include <functional>

namespace tessera::model {
namespace {

size_t HashOf(std::string_view text) { return std::hash<std::string_view>{}(text); }

}  // namespace

template <typename String>
Result<StringTable> StringTable::BuildFrom(std::span<const String> strings, Duplicates rule) {
  if (strings.size() >= (size_t{1} << 31)) {
    return InvalidArgumentError("string table: " + std::to_string(strings.size()) +
                                " strings (at most 2^31 - 1)");
  }
  size_t bytes = 0;
  for (const String& s : strings) bytes += s.size();
  if (bytes > UINT32_MAX) {
    return InvalidArgumentError("string table: " + std::to_string(bytes) +
                                " bytes of text (at most 4 GiB)");
  }
  StringTable table;
  table.text_.reserve(bytes);
  table.offsets_.reserve(strings.size() + 1);
  table.offsets_.push_back(0);
  for (const String& s : strings) {
    table.text_ += s;
    table.offsets_.push_back(static_cast<uint32_t>(table.text_.size()));
  }
  // At most half full, so that a probe for a missing text ends after ~2 slots.
  table.slots_.assign(std::bit_ceil(std::max<size_t>(2 * strings.size(), 2)), -1);
  const size_t mask = table.slots_.size() - 1;
  for (int32_t i = 0; i < static_cast<int32_t>(strings.size()); ++i) {
    const std::string_view text = table[i];
    for (size_t slot = HashOf(text) & mask;; slot = (slot + 1) & mask) {
      int32_t& entry = table.slots_[slot];
      if (entry < 0) {
        entry = i;
        break;
      }
      if (table[entry] == text) {
        if (rule == Duplicates::kLastWins) entry = i;
        break;
      }
    }
  }
  return table;
}

Result<StringTable> StringTable::Build(std::span<const std::string_view> strings, Duplicates rule) {
  return BuildFrom(strings, rule);
}

Result<StringTable> StringTable::Build(std::span<const std::string> strings, Duplicates rule) {
  return BuildFrom(strings, rule);
}

int32_t StringTable::Find(std::string_view text) const {
  if (slots_.empty()) return -1;
  const size_t mask = slots_.size() - 1;
  for (size_t slot = HashOf(text) & mask;; slot = (slot + 1) & mask) {
    const int32_t entry = slots_[slot];
    if (entry < 0) return -1;
    if ((*this)[entry] == text) return entry;
  }
}

size_t StringTable::MemoryBytes() const {
  return text_.capacity() + offsets_.capacity() * sizeof(uint32_t) +
         slots_.capacity() * sizeof(int32_t);
}

}  // namespace tessera::model
