// Named presets stored as data (data/plan/models.json and hardware.json, compiled
// into the binary): model shapes, device specs, links and whole clusters.
// Layer: plan. Used by the `tessera plan` flags and the tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/cluster.h"
#include "plan/model_shape.h"

namespace tessera::plan {

// NotFound listing the known names when `name` is not a preset (case-insensitive).
Result<ModelShape> ModelPreset(std::string_view name);
Result<DeviceSpec> DevicePreset(std::string_view name);
Result<Link> LinkPreset(std::string_view name);
Result<Cluster> ClusterPreset(std::string_view name);

std::vector<std::string> ModelPresetNames();
std::vector<std::string> DevicePresetNames();
std::vector<std::string> LinkPresetNames();
std::vector<std::string> ClusterPresetNames();

// Parses one model object as stored in models.json (also accepted from a user file).
Result<ModelShape> ParseModelShapeJson(std::string_view json_text, std::string_view origin);

}  // namespace tessera::plan
