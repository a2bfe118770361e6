// UiStateJson: the JSON behind the live view (GET /ui/state, drawn by the page in
// src/serve/ui/) — the deployment (plan, ranks and their groups), the scheduler's
// queue and KV usage, each rank's time split into compute / communication /
// waiting over the last poll interval and since start, the ledgers' bytes per
// group and primitive, and the latencies of the requests of the last minutes.
// Layer: serve; OpenAiServer calls it. Pure: values in, text out.
#pragma once

#include <cstdint>
#include <string>

#include "engine/scheduler.h"
#include "serve/metrics.h"

namespace tessera::serve {

struct UiDeployment {
  std::string model_name;
  std::string plan;  // parallel::Partition::ToString(), "" for one rank
  int64_t max_model_len = 0;
  int64_t kv_block_size = 0;
  int64_t started_ns = 0;  // NowNs() when the server was built
};

// Latencies are bucketed by kUiBucketNs over Metrics::kRecentWindowNs, oldest first.
inline constexpr int64_t kUiBucketNs = int64_t{10} * 1'000'000'000;

std::string UiStateJson(const UiDeployment& deployment, const engine::SchedulerStats& stats,
                        const LiveView& live, int64_t now_ns);

}  // namespace tessera::serve
