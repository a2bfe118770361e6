#include "plan/presets.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "plan/presets_data.h"

namespace tessera::plan {
namespace {

using nlohmann::json;

std::string Lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Parsed once; the embedded data is checked by the preset tests.
const json& Models() {
  static const json models = json::parse(internal::kModelsJson).at("models");
  return models;
}
const json& Hardware() {
  static const json hardware = json::parse(internal::kHardwareJson);
  return hardware;
}

std::vector<std::string> NamesOf(const json& list) {
  std::vector<std::string> names;
  for (const json& item : list) names.push_back(item.at("name").get<std::string>());
  return names;
}

Result<const json*> FindNamed(const json& list, std::string_view kind, std::string_view name) {
  const std::string wanted = Lower(name);
  for (const json& item : list) {
    if (Lower(item.at("name").get<std::string>()) == wanted) return &item;
  }
  std::string known;
  for (const std::string& n : NamesOf(list)) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("unknown " + std::string(kind) + " preset '" + std::string(name) +
                       "' (known: " + known + ")");
}

Result<ModelShape> ModelFromJson(const json& j) {
  ModelShape m;
  try {
    m.name = j.value("name", std::string("custom"));
    m.num_layers = j.at("layers").get<int64_t>();
    m.dim = j.at("hidden").get<int64_t>();
    m.num_heads = j.at("heads").get<int64_t>();
    m.num_kv_heads = j.value("kv_heads", m.num_heads);
    m.head_dim = j.value("head_dim", m.num_heads > 0 ? m.dim / m.num_heads : 0);
    m.ffn_dim = j.value("ffn", int64_t{0});
    m.vocab_size = j.at("vocab").get<int64_t>();
    m.num_experts = j.value("experts", int64_t{0});
    m.num_experts_used = j.value("experts_used", int64_t{0});
    m.expert_ffn_dim = j.value("expert_ffn", int64_t{0});
    m.num_shared_experts = j.value("shared_experts", int64_t{0});
    m.shared_expert_ffn_dim = j.value("shared_expert_ffn", int64_t{0});
    m.num_dense_layers = j.value("dense_layers", int64_t{0});
    m.kv_latent_dim = j.value("kv_latent_dim", int64_t{0});
    m.tied_output = j.value("tied_embeddings", false);
    m.weight_dtype = j.value("weight_dtype", std::string("bf16"));
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("model JSON: ") + e.what());
  }
  TESSERA_RETURN_IF_ERROR(ValidateModelShape(m));
  return m;
}

DeviceSpec DeviceFromJson(const json& j) {
  DeviceSpec d;
  d.name = j.value("name", std::string("custom"));
  d.memory_gb = j.at("memory_gb").get<double>();
  d.memory_bandwidth_gbps = j.at("memory_bandwidth_gbps").get<double>();
  d.tflops = j.at("tflops").get<double>();
  return d;
}

Link LinkFromJson(const json& j) {
  Link l;
  l.name = j.value("name", std::string("custom"));
  l.bandwidth_gbps = j.at("bandwidth_gbps").get<double>();
  l.latency_us = j.at("latency_us").get<double>();
  return l;
}

}  // namespace

Result<ModelShape> ModelPreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(const json* j, FindNamed(Models(), "model", name));
  return ModelFromJson(*j);
}

Result<DeviceSpec> DevicePreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(const json* j, FindNamed(Hardware().at("devices"), "device", name));
  return DeviceFromJson(*j);
}

Result<Link> LinkPreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(const json* j, FindNamed(Hardware().at("links"), "link", name));
  return LinkFromJson(*j);
}

Result<Cluster> ClusterPreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(const json* j, FindNamed(Hardware().at("clusters"), "cluster", name));
  return ParseClusterJson(j->dump(), "cluster preset '" + std::string(name) + "'");
}

std::vector<std::string> ModelPresetNames() { return NamesOf(Models()); }
std::vector<std::string> DevicePresetNames() { return NamesOf(Hardware().at("devices")); }
std::vector<std::string> LinkPresetNames() { return NamesOf(Hardware().at("links")); }
std::vector<std::string> ClusterPresetNames() { return NamesOf(Hardware().at("clusters")); }

Result<ModelShape> ParseModelShapeJson(std::string_view json_text, std::string_view origin) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(std::string(origin) + ": not a JSON object");
  }
  Result<ModelShape> model = ModelFromJson(j);
  if (!model.ok()) return model.status().WithContext(origin);
  return model;
}

}  // namespace tessera::plan
