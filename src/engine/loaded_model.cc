#include "engine/loaded_model.h"

#include "model/hf_checkpoint.h"

namespace tessera::engine {

Result<LoadedModel> LoadModel(const std::string& path) {
  LoadedModel loaded;
  TESSERA_ASSIGN_OR_RETURN(model::GgufFile file, model::OpenModelFile(path));
  loaded.file = std::make_unique<model::GgufFile>(std::move(file));
  TESSERA_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::FromGguf(*loaded.file));
  loaded.tokenizer = std::make_unique<model::Tokenizer>(std::move(tokenizer));
  TESSERA_ASSIGN_OR_RETURN(model::LlamaModel llama, model::LlamaModel::Load(*loaded.file));
  loaded.model = std::make_unique<model::LlamaModel>(std::move(llama));
  return loaded;
}

}  // namespace tessera::engine
