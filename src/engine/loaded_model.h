// LoadedModel: a GGUF file opened for inference — the mapping, its tokenizer and
// the bound llama model — kept together so the views stay valid. Layer: engine;
// used by `tessera generate`, `tessera bench model` and tests. Immutable after
// loading; safe to share between threads.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace tessera::engine {

struct LoadedModel {
  std::unique_ptr<model::GgufFile> file;  // owns the mapping every view points into
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::LlamaModel> model;
};

// Opens, validates and binds `path`. Every error names the file and the problem
// (missing, not GGUF, truncated, unsupported architecture or tensor type, wrong
// tensor shape, bad tokenizer data).
Result<LoadedModel> LoadModel(const std::string& path);

}  // namespace tessera::engine
