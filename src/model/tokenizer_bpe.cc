// Byte-level BPE ("gpt2" vocab) encoding, as llama.cpp does it: pre-tokenize into
// words, map each word's bytes to GPT-2's printable code points, then repeatedly
// merge the adjacent pair with the lowest merge rank (leftmost on ties) and emit
// each final piece's token (or its single-character tokens when absent).
#include <queue>

#include "model/pre_tokenizer.h"
#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace tessera::model {
namespace {

// Bytes that GPT-2 keeps as their own code point: '!'..'~', '¡'..'¬', '®'..'ÿ'.
bool IsPrintableByte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  ByteMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) to_cp[b] = IsPrintableByte(b) ? b : next++;
  }
};
const ByteMap& GetByteMap() {
  static const ByteMap map;
  return map;
}

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;
};

struct Bigram {
  int left;
  int right;
  int rank;
  size_t size;
};

struct BigramGreater {  // min-heap on (rank, left)
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

uint32_t ByteToCodepoint(uint8_t byte) { return GetByteMap().to_cp[byte]; }

int CodepointToByte(uint32_t cp) {
  if (cp < 256 && IsPrintableByte(static_cast<int>(cp))) return static_cast<int>(cp);
  if (cp >= 256 && cp < 256 + 68) {
    // The 68 remapped bytes, in increasing byte order.
    int k = static_cast<int>(cp - 256);
    for (int b = 0; b < 256; ++b) {
      if (!IsPrintableByte(b) && k-- == 0) return b;
    }
  }
  return -1;
}

void Tokenizer::Impl::EncodeBpe(std::string_view text, std::vector<TokenId>* out) const {
  std::string word;
  std::string pair;
  std::vector<Symbol> symbols;
  for (std::string_view raw : PreTokenize(text, vocab.pre)) {
    word.clear();
    for (char c : raw) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &word);
    if (ignore_merges) {
      if (TokenId id = Lookup(word); id >= 0) {
        out->push_back(id);
        continue;
      }
    }
    symbols.clear();
    for (size_t offset = 0; offset < word.size();) {
      size_t len =
          std::min(Utf8SequenceLength(static_cast<uint8_t>(word[offset])), word.size() - offset);
      int index = static_cast<int>(symbols.size());
      symbols.push_back(
          {index - 1, offset + len == word.size() ? -1 : index + 1, word.data() + offset, len});
      offset += len;
    }
    std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue;
    auto add_bigram = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      pair.assign(symbols[left].text, symbols[left].n);
      pair += ' ';
      pair.append(symbols[right].text, symbols[right].n);
      const int32_t rank = merges.Find(pair);
      if (rank < 0) return;
      queue.push({left, right, rank, symbols[left].n + symbols[right].n});
    };
    for (size_t i = 1; i < symbols.size(); ++i) add_bigram(static_cast<int>(i) - 1, i);
    while (!queue.empty()) {
      Bigram bigram = queue.top();
      queue.pop();
      Symbol& left = symbols[bigram.left];
      Symbol& right = symbols[bigram.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = bigram.left;
      add_bigram(left.prev, bigram.left);
      add_bigram(bigram.left, left.next);
    }
    for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
      std::string_view piece(symbols[i].text, symbols[i].n);
      if (TokenId id = Lookup(piece); id >= 0) {
        out->push_back(id);
        continue;
      }
      // Not a token (a vocabulary without some merge result): one token per
      // character, each of which stands for one byte; skip any the vocabulary lacks.
      for (size_t k = 0; k < piece.size();) {
        size_t len = std::min(Utf8SequenceLength(static_cast<uint8_t>(piece[k])), piece.size() - k);
        TokenId id = Lookup(piece.substr(k, len));
        if (id >= 0) out->push_back(id);
        k += len;
      }
    }
  }
}

}  // namespace tessera::model
