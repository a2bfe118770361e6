// SentencePiece-style ("llama" vocab) encoding, as llama.cpp does it: split the
// text into UTF-8 characters, repeatedly merge the adjacent pair whose
// concatenation is the highest-scoring token (leftmost on ties), then emit each
// piece's token, or its bytes as <0xXX> tokens when it is not in the vocabulary.
#include <queue>
#include <unordered_map>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace tessera::model {
namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;  // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  explicit SpmSession(const Tokenizer::Impl& impl) : impl_(impl) {}

  void Encode(std::string_view text, std::vector<TokenId>* out) {
    size_t offset = 0;
    int index = 0;
    while (offset < text.size()) {
      size_t len =
          std::min(Utf8SequenceLength(static_cast<uint8_t>(text[offset])), text.size() - offset);
      symbols_.push_back(
          {index - 1, offset + len == text.size() ? -1 : index + 1, text.data() + offset, len});
      offset += len;
      ++index;
    }
    for (size_t i = 1; i < symbols_.size(); ++i) TryAddBigram(static_cast<int>(i) - 1, i);
    while (!queue_.empty()) {
      Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;  // stale
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      TryAddBigram(left.prev, bigram.left);
      TryAddBigram(bigram.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      Resegment(std::string_view(symbols_[i].text, symbols_[i].n), out);
    }
  }

 private:
  void TryAddBigram(int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view text(symbols_[left].text, symbols_[left].n + symbols_[right].n);
    TokenId id = impl_.Lookup(text);
    if (id < 0) return;
    float score = impl_.vocab.scores.empty() ? 0.0f : impl_.vocab.scores[id];
    queue_.push({left, right, score, text.size()});
    rev_merge_[text] = symbols_[left].n;
  }

  // Emits the token of `text`, or splits it where it was merged, or its bytes.
  void Resegment(std::string_view text, std::vector<TokenId>* out) {
    TokenId id = impl_.Lookup(text);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
    auto it = rev_merge_.find(text);
    if (it == rev_merge_.end() || it->second == 0 || it->second >= text.size()) {
      for (char c : text) {
        TokenId byte_id = impl_.byte_tokens[static_cast<uint8_t>(c)];
        out->push_back(byte_id >= 0 ? byte_id : impl_.vocab.unk_id);
      }
      return;
    }
    size_t split = it->second;
    Resegment(text.substr(0, split), out);
    Resegment(text.substr(split), out);
  }

  const Tokenizer::Impl& impl_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue_;
  // Merged text -> length of its left part. Keys view the text being encoded.
  std::unordered_map<std::string_view, size_t> rev_merge_;
};

}  // namespace

void Tokenizer::Impl::EncodeSpm(std::string_view text, std::vector<TokenId>* out) const {
  SpmSession(*this).Encode(text, out);
}

}  // namespace tessera::model
