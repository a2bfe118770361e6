// Planner inputs the CLI reads from files: a GGUF's hyper-parameters as a
// plan::ModelShape (for `tessera plan MODEL.gguf` and `generate --ledger`).
// Layer: apps.
#pragma once

#include <string>

#include "base/status.h"
#include "model/gguf.h"
#include "plan/model_shape.h"

namespace tessera::cli {

// The weight format is the one holding most of the file's tensor bytes.
Result<plan::ModelShape> ModelShapeFromGguf(const model::GgufFile& file, const std::string& name);
Result<plan::ModelShape> ModelShapeFromGguf(const std::string& path);

}  // namespace tessera::cli
