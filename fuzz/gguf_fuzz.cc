// libFuzzer target for the GGUF reader: any byte string must give either a
// GgufFile or an error Status — never a crash, a hang, a leak or a huge
// allocation. Valid inputs are further driven through ModelConfig, tensor
// validation and the tokenizer. Corpus: fuzz/corpus/gguf (tiny valid GGUFs).
#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::model;
  tessera::Result<GgufFile> file = GgufFile::FromBytes({data, size}, "fuzz");
  if (!file.ok()) return 0;
  // Touch every tensor's bytes (out-of-bounds views would trip ASan).
  uint64_t sum = 0;
  for (const GgufTensor& t : file->tensors()) {
    if (!t.data.empty()) sum += t.data.front() + t.data.back();
  }
  for (const GgufKeyValue& kv : file->metadata()) sum += kv.value.Summary().size();
  tessera::Result<ModelConfig> config = ModelConfigFromGguf(*file);
  if (config.ok()) {
    // Bound the work: huge declared layer counts only cost time here.
    if (config->num_layers <= 64) (void)ValidateModelTensors(*file, *config);
  }
  tessera::Result<Tokenizer> tokenizer = Tokenizer::FromGguf(*file);
  if (tokenizer.ok()) {
    std::vector<TokenId> ids = tokenizer->Encode("Hello world, 🦙 12345!\n");
    IncrementalDecoder decoder(*tokenizer);
    for (TokenId id : ids) sum += decoder.Push(id).size();
    sum += decoder.Flush().size();
  }
  return sum == 0xdeadbeef ? 1 : 0;
}
