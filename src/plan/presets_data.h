// The preset JSON files from data/plan/, embedded at build time
// (presets_data.cc.in). Layer: plan; read only by presets.cc.
#pragma once

namespace tessera::plan::internal {

extern const char kModelsJson[];
extern const char kHardwareJson[];

}  // namespace tessera::plan::internal
