#include "plan/model_shape.h"

#include <string>

namespace tessera::plan {
namespace {

Status Positive(std::string_view what, int64_t value) {
  if (value > 0) return Status::Ok();
  return InvalidArgumentError(std::string(what) + " must be positive, got " +
                              std::to_string(value));
}

}  // namespace

Status ValidateModelShape(const ModelShape& m) {
  const std::string where = "model '" + m.name + "'";
  TESSERA_RETURN_IF_ERROR(Positive("layers", m.num_layers).WithContext(where));
  TESSERA_RETURN_IF_ERROR(Positive("hidden", m.dim).WithContext(where));
  TESSERA_RETURN_IF_ERROR(Positive("heads", m.num_heads).WithContext(where));
  TESSERA_RETURN_IF_ERROR(Positive("kv_heads", m.num_kv_heads).WithContext(where));
  TESSERA_RETURN_IF_ERROR(Positive("head_dim", m.head_dim).WithContext(where));
  TESSERA_RETURN_IF_ERROR(Positive("vocab", m.vocab_size).WithContext(where));
  if (m.num_heads % m.num_kv_heads != 0) {
    return InvalidArgumentError(where + ": heads (" + std::to_string(m.num_heads) +
                                ") must be a multiple of kv_heads (" +
                                std::to_string(m.num_kv_heads) + ")");
  }
  if (m.kv_latent_dim < 0) return InvalidArgumentError(where + ": kv_latent_dim is negative");
  const bool has_dense_layers = !m.is_moe() || m.num_dense_layers > 0;
  if (has_dense_layers) TESSERA_RETURN_IF_ERROR(Positive("ffn", m.ffn_dim).WithContext(where));
  if (m.num_experts < 0) return InvalidArgumentError(where + ": experts is negative");
  if (m.is_moe()) {
    TESSERA_RETURN_IF_ERROR(Positive("experts_used", m.num_experts_used).WithContext(where));
    TESSERA_RETURN_IF_ERROR(Positive("expert_ffn", m.expert_ffn_dim).WithContext(where));
    if (m.num_experts_used > m.num_experts) {
      return InvalidArgumentError(where + ": experts_used (" + std::to_string(m.num_experts_used) +
                                  ") exceeds experts (" + std::to_string(m.num_experts) + ")");
    }
    if (m.num_dense_layers < 0 || m.num_dense_layers >= m.num_layers) {
      return InvalidArgumentError(where + ": dense_layers must be in [0, layers)");
    }
    if (m.num_shared_experts < 0) return InvalidArgumentError(where + ": shared_experts < 0");
    if (m.num_shared_experts > 0) {
      TESSERA_RETURN_IF_ERROR(
          Positive("shared_expert_ffn", m.shared_expert_ffn_dim).WithContext(where));
    }
  } else if (m.num_experts_used != 0 || m.num_shared_experts != 0 || m.num_dense_layers != 0) {
    return InvalidArgumentError(where +
                                ": experts_used/shared_experts/dense_layers need experts > 0");
  }
  return Status::Ok();
}

ParamCounts CountParams(const ModelShape& m) {
  ParamCounts p;
  const int64_t q_dim = m.num_heads * m.head_dim;
  const int64_t kv_dim = m.num_kv_heads * m.head_dim;
  p.attention_per_layer = m.dim * q_dim + 2 * m.dim * kv_dim + q_dim * m.dim;
  p.norms_per_layer = 2 * m.dim;
  p.dense_ffn_per_layer = 3 * m.dim * m.ffn_dim;
  if (m.is_moe()) {
    p.expert = 3 * m.dim * m.expert_ffn_dim;
    p.shared_per_layer = m.num_shared_experts * 3 * m.dim * m.shared_expert_ffn_dim;
    p.router_per_layer = m.dim * m.num_experts;
  }
  p.embedding = m.vocab_size * m.dim;
  p.output = m.tied_output ? 0 : m.vocab_size * m.dim;
  p.final_norm = m.dim;
  return p;
}

int64_t ParamCounts::Total(const ModelShape& m) const {
  const int64_t dense_layers = m.is_moe() ? m.num_dense_layers : m.num_layers;
  const int64_t moe_layers = m.num_moe_layers();
  return m.num_layers * (attention_per_layer + norms_per_layer) +
         dense_layers * dense_ffn_per_layer +
         moe_layers * (m.num_experts * expert + shared_per_layer + router_per_layer) + embedding +
         output + final_norm;
}

int64_t ParamCounts::ActivePerToken(const ModelShape& m) const {
  const int64_t dense_layers = m.is_moe() ? m.num_dense_layers : m.num_layers;
  const int64_t moe_layers = m.num_moe_layers();
  // The embedding is a row lookup, not a matmul: it is not counted as touched.
  return m.num_layers * (attention_per_layer + norms_per_layer) +
         dense_layers * dense_ffn_per_layer +
         moe_layers * (m.num_experts_used * expert + shared_per_layer + router_per_layer) +
         (m.tied_output ? embedding : output) + final_norm;
}

}  // namespace tessera::plan
