// tokenizer.json / tokenizer_config.json <-> GGUF tokenizer metadata, for the two
// vocabularies tokenizer.h implements: byte-level BPE (GPT-2, Llama 3, Qwen2
// pre-tokenizers) and SentencePiece BPE as Hugging Face converts it (Llama 2: a
// BPE model with byte fallback, "▁" for spaces, merges in score order). Layer:
// model; private to hf_checkpoint.cc and its tests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace tessera::model {

// Sets tokenizer.ggml.* (and tokenizer.chat_template) on `out` from a checkpoint's
// tokenizer.json, tokenizer_config.json (null when absent) and config.json (for
// bos/eos ids when the tokenizer config names none). `vocab_rows` is the
// embedding's row count: ids up to it without a token become unused "[PAD<id>]"
// tokens, as llama.cpp's converter does. `name` is for messages.
Status HfTokenizerToGguf(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                         const nlohmann::json& config, int64_t vocab_rows, const std::string& name,
                         GgufWriter& out);

// The tokenizer.json and tokenizer_config.json texts of `file`'s tokenizer.ggml.*
// metadata (and tokenizer.chat_template). A SentencePiece vocabulary's merges are
// every split of a piece into two pieces, in the order of the merged piece's score.
Status GgufTokenizerToHf(const GgufFile& file, std::string* tokenizer_json,
                         std::string* tokenizer_config_json);

}  // namespace tessera::model
