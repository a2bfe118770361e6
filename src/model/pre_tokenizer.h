// Splits text into the words a byte-level BPE vocabulary merges within, by the
// regular expressions of GPT-2, Llama 3 and Qwen2, implemented by hand over Unicode
// classes (unicode.h). Layer: model (tokenizer internals). Pure; thread-safe.
#pragma once

#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace tessera::model {

// The words of `text` in order; their concatenation is `text` (bytes that are not
// valid UTF-8 are kept, each as a symbol of its own class).
std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizer kind);

}  // namespace tessera::model
