// The stories260K tokenizer (512 tokens, SentencePiece), loaded once, for the
// serve unit tests that turn tokens into text.
#pragma once

#include <string>
#include <utility>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tessera::serve {

inline const model::Tokenizer& StoriesTokenizer() {
  static const model::Tokenizer tokenizer = [] {
    const std::string path = std::string(TESSERA_SHARED_DIR) + "/models/stories260K.gguf";
    model::GgufFile file = std::move(model::GgufFile::Open(path).value());
    return std::move(model::Tokenizer::FromGguf(file).value());
  }();
  return tokenizer;
}

}  // namespace tessera::serve
