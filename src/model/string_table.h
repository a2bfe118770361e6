// StringTable: an immutable list of strings stored back to back in one buffer,
// with an open-addressing index from text to position. Layer: model.
//
// The tokenizer's vocabulary (32k–256k short pieces) and BPE merges (up to a few
// hundred thousand "left right" pairs) are its users: as a std::string each plus an
// unordered_map node each they cost ~100 bytes of overhead a string (a 32k
// vocabulary ~3 MiB of heap, a llama-3 merge list ~30 MiB); here a 4-byte offset
// and 8–16 bytes of index (a 4-byte slot, at most half of them used).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::model {

class StringTable {
 public:
  // Which position Find gives for a text that occurs more than once.
  enum class Duplicates { kFirstWins, kLastWins };

  StringTable() = default;

  // InvalidArgument when there are 2^31 strings or more or their bytes add up to
  // 4 GiB or more.
  static Result<StringTable> Build(std::span<const std::string_view> strings, Duplicates rule);
  static Result<StringTable> Build(std::span<const std::string> strings, Duplicates rule);

  int64_t size() const { return offsets_.empty() ? 0 : static_cast<int64_t>(offsets_.size()) - 1; }
  bool empty() const { return size() == 0; }
  std::string_view operator[](int64_t i) const {
    return std::string_view(text_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  // The position of `text` (see Duplicates), -1 when it is not in the table.
  int32_t Find(std::string_view text) const;

  // Heap bytes held (for tests and memory accounting).
  size_t MemoryBytes() const;

 private:
  template <typename String>
  static Result<StringTable> BuildFrom(std::span<const String> strings, Duplicates rule);

  std::string text_;               // every string, back to back
  std::vector<uint32_t> offsets_;  // string i is text_[offsets_[i], offsets_[i + 1])
  std::vector<int32_t> slots_;     // power-of-two hash index of positions, -1 empty
};

}  // namespace tessera::model
