// Hugging Face checkpoints: a directory of config.json, model.safetensors (or
// shards named by model.safetensors.index.json), tokenizer.json and
// tokenizer_config.json, read as the GgufFile the rest of tessera loads (the
// hyper-parameters and tokenizer become GGUF metadata, the tensors views of the
// mapped safetensors under their GGUF names), and written from a GGUF (tests,
// `tessera synth --format safetensors`). Architectures: llama, mistral, qwen2 and
// Mixtral-style MoE, in f32, f16 or bf16. Layer: model. Format notes and the
// mapping of names: docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"
#include "kernels/weight_type.h"
#include "model/gguf.h"

namespace tessera::model {

// True when `path` is a directory (a checkpoint, or something claiming to be one).
bool IsCheckpointDirectory(const std::string& path);

// Opens a model: a Hugging Face checkpoint directory (OpenHfCheckpoint) or a GGUF
// file (GgufFile::Open). What every command that takes --model calls.
Result<GgufFile> OpenModelFile(const std::string& path);

// Reads the checkpoint in `dir`. Only headers and JSON are read: the weights stay
// in the mappings until bound (a rank touches only its shard's bytes). Every error
// names the file and the problem (missing file, JSON that does not parse, an
// unsupported architecture or dtype, a tensor missing, misshapen or unknown, a
// shard the index names that is absent, bytes outside a file).
Result<GgufFile> OpenHfCheckpoint(const std::string& dir);

struct HfExportOptions {
  // Every tensor in this type (f32, f16 or bf16); empty: matrices as stored in the
  // GGUF, vectors f32.
  std::optional<kernels::WeightType> dtype;
  // Split the weights into files of at most about this many bytes (with an index);
  // 0: one model.safetensors.
  int64_t max_shard_bytes = 0;
};

// Writes `file` (a llama/mistral/qwen2 or llama-MoE GGUF in f32/f16/bf16, with a
// tokenizer) as a Hugging Face checkpoint into `dir` (created if absent): the
// weights under their HF names in HF's layout (query/key rows in rotate-half
// order), config.json, tokenizer.json and tokenizer_config.json (with the chat
// template when the GGUF has one).
Status ExportHfCheckpoint(const GgufFile& file, const std::string& dir,
                          const HfExportOptions& options = {});

}  // namespace tessera::model
