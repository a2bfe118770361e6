// The "# copy mode" lines of `tessera bench comm`: the single-copy window in force,
// where it came from (env, calibrated, cached, default), and with --calibrate the
// calibration's table. Layer: comm (benchmark support); called by RunCommBench.
#pragma once

#include <cstdio>

#include "comm/calibration.h"
#include "comm/options.h"

namespace tessera::comm {

// Writes "# copy mode: …" (and the measured points when `table`) to `out`.
void PrintCopyMode(const CopyModeReport& report, const CommOptions& options, bool table, FILE* out);

}  // namespace tessera::comm
