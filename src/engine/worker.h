// ServeWorker: the loop of every rank but the driver — receive the next step
// message from upstream (without a deadline between steps: a server may idle for
// hours, though a dead peer is still noticed at once), run it on this rank's
// shard, forward it; on the driver's report request, forward it and send this
// rank's report so far to the driver; on an expert placement, forward it, re-place
// this rank's experts and report likewise (the report is the driver's
// acknowledgement); on its stop message, forward the stop and send the final
// report. Layer: engine.
#pragma once

#include "base/status.h"
#include "engine/stage_runner.h"

namespace tessera::engine {

// Serves steps until the driver's stop message; the first error ends it.
Status ServeWorker(StageRunner& runner);

}  // namespace tessera::engine
