#include "apps/tessera/plan_inputs.h"

#include <map>

#include "kernels/weight_type.h"
#include "model/config.h"
#include "model/hf_checkpoint.h"

namespace tessera::cli {

// A GGUF's hyper-parameters as a plan::ModelShape; the weight format is the one
// holding most of the file's tensor bytes.
Result<plan::ModelShape> ModelShapeFromGguf(const model::GgufFile& file, const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfigFromGguf(file));
  plan::ModelShape m;
  m.name = config.name.empty() ? path : config.name;
  m.num_layers = config.num_layers;
  m.dim = config.dim;
  m.num_heads = config.num_heads;
  m.num_kv_heads = config.num_kv_heads;
  m.head_dim = config.head_dim;
  m.ffn_dim = config.ffn_dim;
  m.vocab_size = config.vocab_size;
  m.num_experts = config.num_experts;
  m.num_experts_used = config.num_experts_used;
  m.expert_ffn_dim = config.is_moe() ? config.expert_ffn_dim : 0;
  m.num_shared_experts = config.shared_expert_ffn_dim > 0 ? 1 : 0;
  m.shared_expert_ffn_dim = config.shared_expert_ffn_dim;
  m.tied_output = config.tied_output;
  std::map<std::string, size_t> bytes_by_type;
  for (const model::GgufTensor& t : file.tensors()) {
    bytes_by_type[std::string(kernels::TraitsOf(t.type).name)] += t.size_bytes();
  }
  size_t best = 0;
  for (const auto& [name, bytes] : bytes_by_type) {
    if (bytes > best) {
      best = bytes;
      m.weight_dtype = name;
    }
  }
  TESSERA_RETURN_IF_ERROR(plan::ValidateModelShape(m).WithContext(path));
  return m;
}

Result<plan::ModelShape> ModelShapeFromGguf(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(model::GgufFile file, model::OpenModelFile(path));
  return ModelShapeFromGguf(file, path);
}

}  // namespace tessera::cli
